package fsm

import (
	"slices"
	"strings"

	"walden/policy"
	waldenv1 "walden/proto/walden/v1"
)

// Renewal is what a coordinator reads of its applied state to grant one
// lease renewal (detect.Grant). Every voter grants every broker's lease
// every lease_ttl/3, so this read is the hottest of the state: it takes the
// read lock once and copies nothing of the registry.
type Renewal struct {
	// Seeded says the cluster's policy is seeded; LeaseTTLMs and
	// DriftMarginMs are its effective lease_ttl and drift_margin.
	Seeded                    bool
	LeaseTTLMs, DriftMarginMs int64
	// FailoverRequested says an operator requested the failover of the
	// broker at the epoch asked.
	FailoverRequested bool
	// Voters are the voting members sorted by id, with their admin
	// addresses; ConfIndex is the index of their configuration. The slice
	// and its messages are shared by every reader and never modified (a
	// membership change makes new ones): read them, put them in an answer,
	// never change them.
	Voters    []*waldenv1.Voter
	ConfIndex uint64
	// LeaseHorizonMs is the longest lease_ttl + drift_margin the cluster
	// ever used (State.LeaseHorizon).
	LeaseHorizonMs int64
}

// Renewal returns what a grant of broker at epoch needs, or the refusal of
// CheckBroker (UNKNOWN_NODE, NODE_FENCED, EPOCH_EXPIRED) when epoch is not
// the broker's current, unfenced one.
func (s *State) Renewal(broker string, epoch uint64) (Renewal, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, err := s.checkBroker(broker, epoch, nil); err != nil {
		return Renewal{}, err
	}
	b := s.brokers[broker]
	return Renewal{
		Seeded:            s.derived.seeded,
		LeaseTTLMs:        s.derived.policy.GetLeaseTtlMs(),
		DriftMarginMs:     s.derived.policy.GetDriftMarginMs(),
		FailoverRequested: b.GetFailoverRequested() != nil && b.GetFailoverRequested().GetEpoch() == epoch,
		Voters:            s.derived.voters,
		ConfIndex:         s.confIndex,
		LeaseHorizonMs:    s.leaseHorizonMs,
	}, nil
}

// derived are views of the state computed once per change rather than at
// every read: the effective policy and the voters.
type derived struct {
	policy *waldenv1.Policy
	seeded bool
	voters []*waldenv1.Voter
}

// deriveLocked recomputes the derived views; s.mu must be held for writing.
func (s *State) deriveLocked() {
	s.derived.policy, _ = policy.Effective(s.overrides.GetSeed(), s.overrides)
	s.derived.seeded = s.overrides.GetSeed() != nil
	if s.derived.seeded {
		p := s.derived.policy
		s.leaseHorizonMs = max(s.leaseHorizonMs, p.GetLeaseTtlMs()+p.GetDriftMarginMs())
	}
	voters := make([]*waldenv1.Voter, 0, len(s.members))
	for _, m := range s.members {
		if m.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER {
			voters = append(voters, &waldenv1.Voter{Id: m.GetId(), AdminAddr: m.GetAdminAddr(), Incarnation: m.GetIncarnation()})
		}
	}
	slices.SortFunc(voters, func(a, b *waldenv1.Voter) int { return strings.Compare(a.GetId(), b.GetId()) })
	s.derived.voters = voters
}

// LeaseHorizon returns the longest lease_ttl + drift_margin the cluster's
// effective policy ever had, in milliseconds, and whether the policy is
// seeded (0, false before). No grant of any member, past or present, lives
// longer at its grantor: a member that starts without its lease state (an
// empty data dir, a replacement under the same name) waits it out before it
// grants or attests, and voter changes are spaced by it (docs/safety.md).
// It only grows, and is kept in snapshots and backups.
func (s *State) LeaseHorizon() (ms int64, seeded bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.leaseHorizonMs, s.derived.seeded
}
