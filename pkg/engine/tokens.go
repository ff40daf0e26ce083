package engine

import (
	"container/list"
	"context"
	"slices"
	"sync"
)

// tokenCache remembers an engine's tokenizations. The copies of one task
// (a group) render the same prompts and their plans the same acts, so a
// group of eight asks the engine's /tokenize the same question eight times;
// a tokenizer never changes its answer, so the first one serves the rest.
type tokenCache struct {
	mu    sync.Mutex
	limit int
	order *list.List // of *tokenEntry, most recent first
	byKey map[string]*list.Element
}

type tokenEntry struct {
	text string
	ids  []int
}

// tokenCacheSize bounds the texts remembered per engine (most recent kept).
const tokenCacheSize = 4096

func newTokenCache(limit int) *tokenCache {
	return &tokenCache{limit: limit, order: list.New(), byKey: map[string]*list.Element{}}
}

func (c *tokenCache) get(text string) ([]int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[text]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return slices.Clone(el.Value.(*tokenEntry).ids), true
}

func (c *tokenCache) put(text string, ids []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[text]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.byKey[text] = c.order.PushFront(&tokenEntry{text: text, ids: slices.Clone(ids)})
	for c.order.Len() > c.limit {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.byKey, last.Value.(*tokenEntry).text)
	}
}

// Tokenize is the engine's Tokenize, answered from what the engine said
// before for the same text when it can.
func (l *Lease) Tokenize(ctx context.Context, text string) ([]int, error) {
	if ids, ok := l.p.tokens.get(text); ok {
		return ids, nil
	}
	ids, err := l.Client.Tokenize(ctx, text)
	if err == nil {
		l.p.tokens.put(text, ids)
	}
	return ids, err
}
