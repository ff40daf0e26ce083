package sim

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/planact/planact/pkg/reward"
)

// The ensemble judge's contract (pkg/mode, ensemble_pick planner). The
// planner's prompt says it picks ("pick one candidate" … <pick node=…>);
// each observation shows an act's candidates as nodes "<id>-c<N>" and ends
// with what is to be picked, <candidates node="<id>" turn="<t>">1 2 3</candidates>
// (a refused reply's error repeats them). The simulated planner then plans
// one hop per turn (a step cannot use a candidate's answer in the same
// plan), and starts its reply with one <pick node="<id>">N</pick> per step
// listed. It picks, deterministically, a candidate whose answer the world
// says is right, or, at the planner's JudgeErrorRate (rolled per step and
// candidate answers) or when none is right, a wrong one: the first wrong
// candidate, else the first. The answer it picked is what it takes as the
// lookup's result.

var (
	judgePromptRe     = regexp.MustCompile(`(?i)pick node=`)
	candidateIDRe     = regexp.MustCompile(`^(\S+)-c(\d+)_*$`)
	candidatesTagRe   = regexp.MustCompile(`<candidates node="([^"<>]+)" turn="\d+">([\d ]*)</candidates>`)
	observationLineRe = regexp.MustCompile(`^(\S+) `)
)

// isJudgePrompt reports whether the planner picks among candidates.
func isJudgePrompt(prompt string) bool {
	intro, _, _ := strings.Cut(prompt, "Question:")
	return judgePromptRe.MatchString(intro)
}

// judge picks among the candidates every observation shows: it sets the
// lookups they answered to the answers picked, and returns the picks the
// last observation asks for.
func (e *Engine) judge(p *plannerPrompt, prompt string) string {
	type cand struct {
		number        int
		query, answer string
	}
	picked := map[string]int{} // step -> number picked, from the latest observation showing its candidates
	for _, block := range observationRe.FindAllStringSubmatch(prompt, -1) {
		steps := map[string][]cand{}
		var order []string
		for line := range strings.SplitSeq(block[1], "\n") {
			line = strings.TrimSpace(line)
			id := observationLineRe.FindStringSubmatch(line)
			if id == nil {
				continue
			}
			m := candidateIDRe.FindStringSubmatch(id[1])
			input, output, ok := parseObservationLine(line)
			if m == nil || !ok || strings.HasPrefix(output, "ERROR") || strings.HasPrefix(output, "SKIPPED") {
				continue
			}
			n, _ := strconv.Atoi(m[2])
			if _, seen := steps[m[1]]; !seen {
				order = append(order, m[1])
			}
			steps[m[1]] = append(steps[m[1]], cand{n, input, output})
		}
		for _, step := range order {
			cs := steps[step]
			q := cs[0].query
			truth, known := e.world.Lookup(stripMarkers(q))
			var answers []string
			right, wrong := -1, -1
			for i, c := range cs {
				answers = append(answers, c.answer)
				if known && reward.Normalize(c.answer) == reward.Normalize(truth) {
					if right < 0 {
						right = i
					}
				} else if wrong < 0 {
					wrong = i
				}
			}
			i := 0
			switch {
			case right >= 0 && wrong >= 0 && roll(e.cfg.JudgeErrorRate, e.cfg.Seed, "misjudge", normQuery(q), strings.Join(answers, "\x00")):
				i = wrong
			case right >= 0:
				i = right
			case wrong >= 0:
				i = wrong
			}
			picked[step] = cs[i].number
			p.observed[normQuery(q)] = cs[i].answer
		}
	}
	blocks := observationRe.FindAllStringSubmatch(prompt, -1)
	if len(blocks) == 0 {
		return ""
	}
	var b strings.Builder
	for _, m := range candidatesTagRe.FindAllStringSubmatch(blocks[len(blocks)-1][1], -1) {
		n, ok := picked[m[1]]
		if !ok {
			n, _ = strconv.Atoi(strings.Fields(m[2] + " 0")[0]) // candidates not seen: the first offered
		}
		fmt.Fprintf(&b, "<pick node=%q>%d</pick>\n", m[1], n)
	}
	return b.String()
}
