package fsm

import (
	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// applySeedPolicy founds the cluster's policy: the seed is set once, from
// the config file of the member that led first; a seed proposed again (by a
// later leader that saw no seed yet) changes nothing. An invalid seed is
// refused.
func (s *State) applySeedPolicy(index uint64, cmd *waldenv1.Command, op *waldenv1.SeedPolicy) (*waldenv1.Result, error) {
	if s.overrides.GetSeed() != nil {
		return &waldenv1.Result{Value: &waldenv1.Result_Policy{Policy: clone(s.overrides)}}, nil
	}
	if op.GetPolicy() == nil {
		return nil, invalid("seed policy: no policy")
	}
	if err := policy.Validate(op.GetPolicy()); err != nil {
		return nil, invalid("seed policy: %v", err)
	}
	s.overrides.Seed = clone(op.GetPolicy())
	s.overrides.SeededBy = actorOf(op.GetSeededBy(), cmd)
	s.overrides.SeedIndex = index
	if eff, _ := policy.Effective(s.overrides.GetSeed(), s.overrides); policy.Validate(eff) != nil {
		// Overrides set before the seed (a cluster founded before policies
		// were seeded) that do not fit it are dropped, never applied unsafe.
		s.overrides.Values, s.overrides.SetIndex = nil, nil
	}
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_POLICY, Actor: s.overrides.GetSeededBy(),
		Detail: &waldenv1.EventDetail{Member: s.overrides.GetSeededBy(), PolicySeeded: true}})
	return &waldenv1.Result{Value: &waldenv1.Result_Policy{Policy: clone(s.overrides)}}, nil
}

// applySetPolicy sets and unsets runtime policy overrides. Every key and
// value is checked (policy.Set: known key, value parses and is in range)
// and the effective policy that results is validated as a whole
// (policy.Validate) before anything changes; values are stored in canonical
// form.
func (s *State) applySetPolicy(index uint64, cmd *waldenv1.Command, op *waldenv1.SetPolicy) (*waldenv1.Result, error) {
	if len(op.GetSet()) == 0 && len(op.GetUnset()) == 0 {
		return nil, invalid("set policy: nothing to set or unset")
	}
	canon := make(map[string]string, len(op.GetSet()))
	detail := &waldenv1.EventDetail{}
	for _, k := range policy.SortedKeys(op.GetSet()) {
		v, err := policy.Canonical(k, op.GetSet()[k])
		if err != nil {
			return nil, invalid("set policy: %v", err)
		}
		canon[k] = v
		detail.PolicySet = append(detail.PolicySet, &waldenv1.PolicyEntry{Key: k, Value: v})
	}
	known := map[string]bool{}
	for _, k := range policy.Keys() {
		known[k] = true
	}
	for _, k := range op.GetUnset() {
		if !known[k] {
			return nil, invalid("set policy: unset %q: %v", k, policy.ErrUnknownKey)
		}
		if _, both := canon[k]; both {
			return nil, invalid("set policy: %q is both set and unset", k)
		}
		detail.PolicyUnset = append(detail.PolicyUnset, k)
	}
	next := clone(s.overrides)
	if next.Values == nil {
		next.Values = map[string]string{}
	}
	for k, v := range canon {
		next.Values[k] = v
	}
	for _, k := range op.GetUnset() {
		delete(next.Values, k)
	}
	if eff, _ := policy.Effective(next.GetSeed(), next); policy.Validate(eff) != nil {
		return nil, invalid("set policy: %v", policy.Validate(eff))
	}
	if s.overrides.Values == nil {
		s.overrides.Values = map[string]string{}
	}
	if s.overrides.SetIndex == nil {
		s.overrides.SetIndex = map[string]uint64{}
	}
	for k, v := range canon {
		s.overrides.Values[k] = v
		s.overrides.SetIndex[k] = index
	}
	for _, k := range op.GetUnset() {
		delete(s.overrides.Values, k)
		delete(s.overrides.SetIndex, k)
	}
	s.recordEvent(index, &waldenv1.Event{EventKind: waldenv1.EventKind_EVENT_KIND_POLICY, Actor: actorOf(op.GetActor(), cmd), Detail: detail})
	return &waldenv1.Result{Value: &waldenv1.Result_Policy{Policy: clone(s.overrides)}}, nil
}

// Policy returns the cluster's effective policy (the seed, or the defaults
// before the cluster is seeded, under the runtime overrides), one entry per
// key with its source, and whether the policy is seeded. Every member that
// applied the same entries answers the same.
func (s *State) Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	eff, entries := policy.Effective(s.overrides.GetSeed(), s.overrides)
	return eff, entries, s.overrides.GetSeed() != nil
}

// PolicyOverrides returns a copy of the runtime policy overrides.
func (s *State) PolicyOverrides() *waldenv1.PolicyOverrides {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return clone(s.overrides)
}
