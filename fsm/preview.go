package fsm

// PreviewAssignee returns the member a recovery job created now would be
// assigned to, among the live members (as a failover decision picks it),
// without changing anything: for `waldenctl failover --dry-run`.
func (s *State) PreviewAssignee(live []string) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pickAssignee(live, "")
}
