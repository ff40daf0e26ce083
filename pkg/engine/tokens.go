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

// TokenizeChat is the chat engine's TokenizeChat. A conversation of one
// message, the first turn that the copies of a task share, is answered
// from what the engine said before for it when it can.
func (l *Lease) TokenizeChat(ctx context.Context, msgs []Message) ([]int, error) {
	ct, ok := l.Client.(ChatTokenizer)
	if !ok {
		return nil, notSupported("tokenize a conversation (only a chat engine, "+ProtocolOpenAIChat+", renders one)", nil)
	}
	key := ""
	if len(msgs) == 1 {
		key = msgs[0].Role + "\x00" + msgs[0].Text
		if ids, ok := l.p.chats.get(key); ok {
			return ids, nil
		}
	}
	ids, err := ct.TokenizeChat(ctx, msgs)
	if err == nil && key != "" {
		l.p.chats.put(key, ids)
	}
	return ids, err
}
