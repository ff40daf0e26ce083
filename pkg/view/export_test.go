package view

// Compacted says whether rollout n's texts were dropped from r's memory.
func Compacted(r *Reader, n int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ro := r.st.rollouts[n]
	return ro != nil && ro.compacted
}
