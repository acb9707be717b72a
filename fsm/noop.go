package fsm

import waldenv1 "walden/proto/walden/v1"

// applyNoop counts the Noop. Its payload is opaque and not kept.
func (s *State) applyNoop(_ *waldenv1.Noop) (*waldenv1.Result, error) {
	s.noopCount++
	return &waldenv1.Result{Value: &waldenv1.Result_Noop{Noop: &waldenv1.NoopResult{Count: s.noopCount}}}, nil
}

// NoopCount is the number of Noop commands applied.
func (s *State) NoopCount() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.noopCount
}
