package schema

import (
	"fmt"
	"strconv"

	"github.com/planact/planact/pkg/subject"
)

// Pause modes: what happens to the generations of a role that are running
// when it is paused.
const (
	PauseWait  = "wait"  // they finish; Pause returns when they have
	PauseAbort = "abort" // they are aborted on the engine and sent again after Resume
)

// Pause asks planact to stop sending generations of Role to its engine,
// before its trainer swaps the weights. Nothing in flight is lost: running
// generations finish (wait) or are aborted and sent again after Resume
// (abort). A pause not resumed within TimeoutS ends at its time-out: the
// work that waits for the role then fails, saying so (PauseExpired), and the
// role's generations go again.
type Pause struct {
	Envelope
	Role     string  `json:"role"`
	Mode     string  `json:"mode"`                // wait (default) or abort
	TimeoutS float64 `json:"timeout_s,omitempty"` // default 600
	Reason   string  `json:"reason,omitempty"`
	AtMs     int64   `json:"at_ms"`
	// Nonce tells this pause from another of the role sent in the same
	// millisecond (two trainer processes; pause, resume and pause again at
	// once). It is part of the message id only, not of the body: a retry of
	// this pause keeps its id (JetStream drops the copy), and a pause
	// without one (a client before it) has the id it always had.
	Nonce string `json:"-"`
}

func (m *Pause) Kind() string    { return "control.pause/1" }
func (m *Pause) Subject() string { return subject.Control(m.Role, "pause") }
func (m *Pause) MsgID() string   { return controlID("pause", m.Role, m.AtMs, m.Nonce) }
func (m *Pause) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// DefaultPauseTimeoutS is how long a pause may last unless it says.
const DefaultPauseTimeoutS = 600

// WithDefaults fills the mode and time-out a pause left out.
func (m Pause) WithDefaults() Pause {
	if m.Mode == "" {
		m.Mode = PauseWait
	}
	if m.TimeoutS == 0 {
		m.TimeoutS = DefaultPauseTimeoutS
	}
	return m
}

// Validate reports the first field of a pause (defaults filled) that holds
// a value planact does not know or that is out of its range.
func (m *Pause) Validate() error {
	if m.Mode != PauseWait && m.Mode != PauseAbort {
		return fmt.Errorf("pause of %s: mode %s: want wait or abort", m.Role, quoteShort(m.Mode))
	}
	if !inSeconds(m.TimeoutS, MinTimeoutS, MaxRolloutTimeoutS) {
		return fmt.Errorf("pause of %s: timeout_s %g: want a number of seconds from %d to %d", m.Role, m.TimeoutS, MinTimeoutS, MaxRolloutTimeoutS)
	}
	return nil
}

// Resume lets planact send generations of Role again, from the weights of
// WeightVersion (the version the engine now runs; samples record it). A
// version older than the role's newest is a rollback (a trainer that went
// back to an earlier checkpoint): planact takes it as the role's newest,
// counts staleness from it, and says so on control.<role>.rollback.
type Resume struct {
	Envelope
	Role          string `json:"role"`
	WeightVersion string `json:"weight_version,omitempty"`
	AtMs          int64  `json:"at_ms"`
	// Nonce tells this resume from another of the role sent in the same
	// millisecond, as a Pause's does: in the message id only.
	Nonce string `json:"-"`
}

// controlID is the message id of a pause or resume (verb): verb.role.at_ms
// and, when it has one, its nonce. Planact answers a pause or resume by
// whatever id it came with (Nats-Msg-Id), the old form without a nonce
// included.
func controlID(verb, role string, atMs int64, nonce string) string {
	if nonce == "" {
		return fmt.Sprintf("%s.%s.%d", verb, role, atMs)
	}
	return fmt.Sprintf("%s.%s.%d.%s", verb, role, atMs, nonce)
}

// Validate reports a field of a resume that planact will not take: a
// weight_version too long to repeat in its answers.
func (m *Resume) Validate() error {
	if len(m.WeightVersion) > MaxWeightVersion {
		return fmt.Errorf("resume of %s: weight_version %s: want at most %d bytes", m.Role, quoteShort(m.WeightVersion), MaxWeightVersion)
	}
	return nil
}

// The longest Nats-Msg-Id of a trainer's message (a pause, a resume, an
// arrival, a cancel), and the longest weight_version of a resume, planact
// takes: its sessions and answers repeat them, and the CONTROL stream
// holds small messages only (a trainer's stream takes a megabyte), a few
// per subject.
const (
	MaxControlID     = 256
	MaxWeightVersion = 1024
)

// MaxReason is the longest reason, in bytes, a pause or a cancel may give:
// planact repeats it (when the pause expires; in a cancelled rollout's
// session, results and answers), and refuses one longer rather than cut
// it short.
const MaxReason = 1 << 10

// CheckControlID reports a pause's or resume's (verb's) message id that
// planact will not take: one longer than MaxControlID.
func CheckControlID(verb, role, id string) error {
	return CheckMsgID(verb+" of "+role, id)
}

// CheckMsgID reports the message id of a trainer's message (what names
// it, "arrival of planner for rollout 7") that planact will not take: one
// longer than MaxControlID.
func CheckMsgID(what, id string) error {
	if len(id) > MaxControlID {
		return fmt.Errorf("%s: Nats-Msg-Id %s: want at most %d bytes", what, quoteShort(id), MaxControlID)
	}
	return nil
}

// TrainerMsgID is what planact names a trainer's arrival or cancel by,
// stored at seq with Nats-Msg-Id id: the id, or seq:<seq> when it has
// none or one that CheckMsgID refuses (which planact does not repeat).
// The session-store and replay name an arrival alike, so that a refusal
// is matched with what it refused.
func TrainerMsgID(id string, seq uint64) string {
	if id == "" || len(id) > MaxControlID {
		return fmt.Sprintf("seq:%d", seq)
	}
	return id
}

func (m *Resume) Kind() string    { return "control.resume/1" }
func (m *Resume) Subject() string { return subject.Control(m.Role, "resume") }
func (m *Resume) MsgID() string   { return controlID("resume", m.Role, m.AtMs, m.Nonce) }
func (m *Resume) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// Rollback says that a role's trainer went back to earlier weights: a
// Resume announced To, older than From, the role's newest version until
// then. Staleness is counted from To from then on; samples generated on
// the weights left behind name them in their weight_versions.
type Rollback struct {
	Envelope
	Role     string `json:"role"`
	From     string `json:"from"`
	To       string `json:"to"`
	ResumeID string `json:"resume_id"` // the Resume's Nats-Msg-Id
	AtMs     int64  `json:"at_ms"`
}

func (m *Rollback) Kind() string    { return "control.rollback/1" }
func (m *Rollback) Subject() string { return subject.Control(m.Role, "rollback") }
func (m *Rollback) MsgID() string   { return fmt.Sprintf("rollback.%s.%s", m.Role, m.ResumeID) }
func (m *Rollback) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// RoleRollback is the last rollback of a role, as its state records it
// before it is published.
type RoleRollback struct {
	From     string `json:"from"`
	To       string `json:"to"`
	ResumeID string `json:"resume_id"`
	AtMs     int64  `json:"at_ms"`
}

// Paused answers a Pause once no generation of the role runs on any
// gateway (Drained lists the gateways that said so; Missing those that did
// not in time, gone or stuck): the trainer may swap its weights.
type Paused struct {
	Envelope
	Role    string   `json:"role"`
	Epoch   int64    `json:"epoch"`
	PauseID string   `json:"pause_id"` // the Pause's Nats-Msg-Id
	Mode    string   `json:"mode"`
	Drained []string `json:"drained,omitempty"`
	Missing []string `json:"missing,omitempty"`
	Aborted int      `json:"aborted,omitempty"` // generations aborted, to be sent again
	AtMs    int64    `json:"at_ms"`
}

func (m *Paused) Kind() string    { return "control.paused/1" }
func (m *Paused) Subject() string { return subject.Control(m.Role, "paused") }
func (m *Paused) MsgID() string   { return fmt.Sprintf("paused.%s.%d", m.Role, m.Epoch) }
func (m *Paused) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// Resumed answers a Resume once the session-store took it: the role's
// generations go again, from WeightVersion, the role's newest weights now
// (a resume that names none leaves the version as it was). Paused says
// that a later pause of the role holds them all the same (one the
// session-store applied first: this resume changed nothing).
type Resumed struct {
	Envelope
	Role          string `json:"role"`
	ResumeID      string `json:"resume_id"` // the Resume's Nats-Msg-Id
	WeightVersion string `json:"weight_version,omitempty"`
	Paused        bool   `json:"paused,omitempty"`
	AtMs          int64  `json:"at_ms"`
}

func (m *Resumed) Kind() string    { return "control.resumed/1" }
func (m *Resumed) Subject() string { return subject.Control(m.Role, "resumed") }
func (m *Resumed) MsgID() string   { return fmt.Sprintf("resumed.%s.%s", m.Role, m.ResumeID) }
func (m *Resumed) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// Refused answers a pause or a resume that planact will not apply: one it
// cannot read, with a field out of range, or whose subject, headers and
// body disagree. Reason names what is wrong (the field and its value). It
// goes to the control subjects of the role the refused message's subject
// names, whatever its body says: only that role's trainer may publish
// there, and only it may read the answer. Published once per refused
// message; nothing of the role changed.
type Refused struct {
	Envelope
	Role   string `json:"role"`
	Verb   string `json:"verb"` // what was refused: pause or resume
	ID     string `json:"id"`   // its Nats-Msg-Id, or "seq:<stream sequence>" if it had none
	Reason string `json:"reason"`
	AtMs   int64  `json:"at_ms"`
}

func (m *Refused) Kind() string    { return "control.refused/1" }
func (m *Refused) Subject() string { return subject.Control(m.Role, "refused") }
func (m *Refused) MsgID() string   { return fmt.Sprintf("refused.%s.%s.%s", m.Role, m.Verb, m.ID) }
func (m *Refused) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// Drained is a gateway saying that, for the pause of the given epoch, it
// runs no generation of the role any more.
type Drained struct {
	Envelope
	Role    string `json:"role"`
	Epoch   int64  `json:"epoch"`
	Gateway string `json:"gateway"` // its service instance id
	Aborted int    `json:"aborted,omitempty"`
	AtMs    int64  `json:"at_ms"`
}

func (m *Drained) Kind() string    { return "control.drained/1" }
func (m *Drained) Subject() string { return subject.Control(m.Role, "drained") + "." + m.Gateway }
func (m *Drained) MsgID() string   { return fmt.Sprintf("drained.%s.%d.%s", m.Role, m.Epoch, m.Gateway) }
func (m *Drained) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// Presence is a gateway saying that it runs role's generations, renewed
// every bus.PresenceBeat; Gone says it stopped, nothing of the role
// running on it any more. A pause waits for each gateway whose last notice
// is here and not Gone (the server drops a notice not renewed in
// bus.PresenceLease).
type Presence struct {
	Envelope
	Role    string `json:"role"`
	Gateway string `json:"gateway"` // its service instance id
	Gone    bool   `json:"gone,omitempty"`
	AtMs    int64  `json:"at_ms"`
}

func (m *Presence) Kind() string    { return "presence/1" }
func (m *Presence) Subject() string { return subject.Presence(m.Role, m.Gateway) }
func (m *Presence) MsgID() string   { return "" } // a renewal, stored however often it comes
func (m *Presence) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// PauseExpired says that a pause ended at its time-out, no resume having
// come: the work that waited for the role (generations held, or aborted by
// an abort-mode pause and waiting to be sent again) failed with the act
// failure "paused", and the role's generations go again, on the weights its
// engine runs. Published once per expired pause, by the session-store
// replica whose compare-and-set ended it.
type PauseExpired struct {
	Envelope
	Role string `json:"role"`
	PauseExpiry
}

func (m *PauseExpired) Kind() string    { return "control.expired/1" }
func (m *PauseExpired) Subject() string { return subject.Control(m.Role, "expired") }
func (m *PauseExpired) MsgID() string   { return fmt.Sprintf("expired.%s.%d", m.Role, m.Epoch) }
func (m *PauseExpired) Meta() Meta      { return Meta{Rollout: -1, Episode: -1, Role: m.Role} }

// PauseExpiry records a pause that ended at its time-out.
type PauseExpiry struct {
	Epoch      int64  `json:"epoch"`    // the pause's epoch (the role's state moved on to Epoch+1)
	PauseID    string `json:"pause_id"` // the Pause's Nats-Msg-Id
	Mode       string `json:"mode"`
	SinceMs    int64  `json:"since_ms"`    // when it was paused
	DeadlineMs int64  `json:"deadline_ms"` // when its time-out passed
	AtMs       int64  `json:"at_ms"`       // when planact ended it
	Reason     string `json:"reason"`      // what the work that waited was told
}

// RoleState is the KV value (bucket sessions, key "role.<role>") that says
// whether a role's generations may be sent, and which weights its engine
// runs. Written by the session-store, by compare-and-set.
type RoleState struct {
	Role   string `json:"role"`
	Paused bool   `json:"paused,omitempty"`
	Mode   string `json:"mode,omitempty"`
	// Epoch grows by one at each pause and resume (a key written anew
	// after it was removed starts at the bucket's last revision, above
	// every earlier one); gateways answer a pause by its epoch.
	Epoch      int64  `json:"epoch"`
	PauseID    string `json:"pause_id,omitempty"`
	SinceMs    int64  `json:"since_ms,omitempty"`
	DeadlineMs int64  `json:"deadline_ms,omitempty"`
	Reason     string `json:"reason,omitempty"` // the pause's
	// Expiry is the last pause that ended at its time-out (not paused since
	// then unless Paused says so). Written in the compare-and-set that
	// ended the pause.
	Expiry *PauseExpiry `json:"expiry,omitempty"`
	// ExpiryAnnounced: control.<role>.expired of Expiry is published.
	ExpiryAnnounced bool `json:"expiry_announced,omitempty"`
	// Answered is the epoch whose pause was answered (Paused published).
	Answered int64 `json:"answered,omitempty"`
	// AnsweredPauses are the ids of the last pauses answered, newest last
	// (at most MaxAnsweredPauses): one delivered again after a later pause
	// or resume is not refused when it was answered.
	AnsweredPauses []string `json:"answered_pauses,omitempty"`
	// WeightVersion is the role's newest weights as its trainer announced
	// them, the trainer's current ones, which staleness is counted from:
	// what the last resume named (older than before: a rollback), or a
	// newer version an arrival brought.
	WeightVersion string `json:"weight_version,omitempty"`
	// Rollback is the last time a resume took the role back to older
	// weights.
	Rollback *RoleRollback `json:"rollback,omitempty"`
	// StateSeq is the trainer stream's sequence of the last pause or
	// resume that set Paused, and VersionSeq of the last resume that set
	// WeightVersion: one older than these (delivered again, or handled
	// after a later one: the consumer runs several handlers at once)
	// changes neither.
	StateSeq   uint64 `json:"state_seq,omitempty"`
	VersionSeq uint64 `json:"version_seq,omitempty"`
}

// MaxAnsweredPauses is how many answered pause ids a RoleState keeps: as
// many as CONTROL keeps answers on a subject (bus.ControlPerSubject).
const MaxAnsweredPauses = 24

// RoleKey is the KV key of a role's state.
func RoleKey(role string) string { return "role." + role }

// VersionNumber reads the number a weight version ends in ("step-7": 7,
// "v12": 12, "42": 42); ok is false when it ends in none. Staleness is
// counted in these numbers.
func VersionNumber(v string) (n int64, ok bool) {
	i := len(v)
	for i > 0 && v[i-1] >= '0' && v[i-1] <= '9' {
		i--
	}
	if i == len(v) {
		return 0, false
	}
	n, err := strconv.ParseInt(v[i:], 10, 64)
	return n, err == nil
}

// Newer reports whether version a is newer than b: by their numbers when
// both have one, else a differs from an empty b.
func Newer(a, b string) bool {
	na, oka := VersionNumber(a)
	nb, okb := VersionNumber(b)
	if oka && okb {
		return na > nb
	}
	return a != "" && b == ""
}

// Behind says how many versions version is behind newest, when both end in
// a number; ok is false when one does not (staleness cannot be counted).
func Behind(newest, version string) (behind int64, ok bool) {
	n, okn := VersionNumber(newest)
	v, okv := VersionNumber(version)
	if !okn || !okv {
		return 0, false
	}
	return max(n-v, 0), true
}
