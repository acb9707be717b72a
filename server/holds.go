package server

import (
	waldenv1 "walden/proto/walden/v1"
)

// holdsOf explains, for every broker that some coordinator observes suspect
// or dead but that is not failed over, why not yet: the reason the leader's
// last decision round gave (Broker.hold_detail, filled when the leader
// answered), in a sentence. It is for people: the web view and
// `waldenctl failover --dry-run`.
func holdsOf(brokers []*waldenv1.Broker) map[string][]string {
	out := map[string][]string{}
	for _, b := range brokers {
		if b.GetFenced() || !anySuspect(b) {
			continue
		}
		switch {
		case b.GetMaintenance():
			out[b.GetBrokerId()] = []string{"in maintenance: automatic failover does not apply (waldenctl maintenance off " + b.GetBrokerId() + ")"}
		case b.GetHoldDetail() != "":
			out[b.GetBrokerId()] = []string{b.GetHold() + ": " + b.GetHoldDetail()}
		case b.GetHold() == "" && b.GetLeaseViewOf() != "":
			// Answered by the leader with nothing holding it: a decision
			// comes at its next round.
			out[b.GetBrokerId()] = []string{"every condition holds: the leader decides at its next round"}
		}
	}
	return out
}

func anySuspect(b *waldenv1.Broker) bool {
	for _, o := range b.GetObservations() {
		if o.GetObservationState() != waldenv1.ObservationState_OBSERVATION_STATE_ALIVE && o.GetEpoch() == b.GetEpoch() {
			return true
		}
	}
	return false
}
