package view

// Compacted says whether rollout n's texts were dropped from r's memory.
func Compacted(r *Reader, n int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro := r.st.rollouts[n]
	return ro != nil && ro.compacted
}

// Held says what r holds in memory of rollout n (ok false: nothing): its
// episodes, their acts, and its task list.
func Held(r *Reader, n int64) (episodes, acts, tasks int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro := r.st.rollouts[n]
	if ro == nil {
		return 0, 0, 0, false
	}
	for _, ep := range ro.episodes {
		acts += len(ep.acts)
	}
	return len(ro.episodes), acts, len(ro.tasks), true
}

// HeldRollouts is how many rollouts r holds in memory.
func HeldRollouts(r *Reader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.st.rollouts)
}
