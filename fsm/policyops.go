package fsm

import (
	"strings"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// applySetPolicy sets and unsets runtime policy overrides. Every key and
// value is checked (policy.Set: known key, value parses and is in range)
// before anything changes; values are stored in canonical form. The
// combination of keys is validated by the proposer against its effective
// policy (the state machine does not know the members' config files).
func (s *State) applySetPolicy(index uint64, cmd *waldenv1.Command, op *waldenv1.SetPolicy) (*waldenv1.Result, error) {
	if len(op.GetSet()) == 0 && len(op.GetUnset()) == 0 {
		return nil, invalid("set policy: nothing to set or unset")
	}
	canon := make(map[string]string, len(op.GetSet()))
	var parts []string
	for _, k := range policy.SortedKeys(op.GetSet()) {
		v, err := policy.Canonical(k, op.GetSet()[k])
		if err != nil {
			return nil, invalid("set policy: %v", err)
		}
		canon[k] = v
		parts = append(parts, k+"="+v)
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
		parts = append(parts, "unset "+k)
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
	s.appendEvent(&waldenv1.Event{Index: index, UnixMs: s.now(), Kind: "policy",
		Actor: actorOf(op.GetActor(), cmd), Message: strings.Join(parts, ", ")})
	return &waldenv1.Result{Value: &waldenv1.Result_Policy{Policy: clone(s.overrides)}}, nil
}

// PolicyOverrides returns a copy of the runtime policy overrides.
func (s *State) PolicyOverrides() *waldenv1.PolicyOverrides {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return clone(s.overrides)
}
