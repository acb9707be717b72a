package detect

import (
	"fmt"
	"slices"
	"time"

	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// RenewalState is what a coordinator reads of its applied state to grant a
// lease renewal (package fsm's State).
type RenewalState interface {
	Broker(id string) (*waldenv1.Broker, bool)
	CheckBroker(brokerID string, epoch uint64, fo *waldenv1.FailoverContext) error
	Policy() (*waldenv1.Policy, []*waldenv1.PolicyEntry, bool)
	Voters() []string
	ConfIndex() uint64
	Members() []*waldenv1.Member
}

// Errors of Grant that are not refusals of the epoch.
var (
	// ErrNotSeeded: the cluster has no policy yet (no leader since it was
	// founded).
	ErrNotSeeded = fmt.Errorf("detect: the cluster's policy is not seeded yet")
	// ErrNotVoter: this member is not a voter; only voters' grants count.
	ErrNotVoter = fmt.Errorf("detect: not a voting member")
)

// Grant grants nodeID's part of the quorum lease of broker at epoch from
// its applied state: only a registered broker's current, unfenced epoch
// (fencing refusals otherwise: the caller confirms with a ReadIndex round a
// refusal that may come from lagging behind), while this member is a voter,
// once the policy is seeded, never an epoch whose failover was requested,
// and only as the grantor allows (not in its quiet period, not an epoch it
// promised never to grant again). The answer names the voters, so the
// agent knows whose grants count and where to renew.
func Grant(st RenewalState, g *lease.Grantor, nodeID, broker string, epoch uint64) (*waldenv1.RenewLeaseResponse, error) {
	if err := st.CheckBroker(broker, epoch, nil); err != nil {
		return nil, err
	}
	p, _, seeded := st.Policy()
	if !seeded {
		return nil, ErrNotSeeded
	}
	voters := st.Voters()
	if !slices.Contains(voters, nodeID) {
		return nil, ErrNotVoter
	}
	b, _ := st.Broker(broker)
	if fr := b.GetFailoverRequested(); fr != nil && fr.GetEpoch() == epoch {
		return nil, fmt.Errorf("lease of broker %q at epoch %d not renewed: %w", broker, epoch, refusal.ErrFailoverRequested)
	}
	ttl := time.Duration(p.GetLeaseTtlMs()) * time.Millisecond
	drift := time.Duration(p.GetDriftMarginMs()) * time.Millisecond
	if err := g.Grant(lease.Key{Broker: broker, Epoch: epoch}, ttl, drift); err != nil {
		return nil, err
	}
	resp := &waldenv1.RenewLeaseResponse{Epoch: epoch, LeaseTtlMs: p.GetLeaseTtlMs(), CoordinatorId: nodeID, ConfIndex: st.ConfIndex()}
	for _, m := range st.Members() {
		if slices.Contains(voters, m.GetId()) {
			resp.Voters = append(resp.Voters, &waldenv1.Voter{Id: m.GetId(), AdminAddr: m.GetAdminAddr()})
		}
	}
	return resp, nil
}
