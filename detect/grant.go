package detect

import (
	"fmt"
	"slices"
	"time"

	"walden/fsm"
	"walden/lease"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
)

// RenewalState is what a coordinator reads of its applied state to grant a
// lease renewal (package fsm's State): every voter grants every broker's
// lease every lease_ttl/3, so it is one read under one lock that copies
// nothing of the registry.
type RenewalState interface {
	Renewal(broker string, epoch uint64) (fsm.Renewal, error)
}

// Errors of Grant that are not refusals of the epoch.
var (
	// ErrNotSeeded: the cluster has no policy yet (no leader since it was
	// founded); the refusal POLICY_NOT_SEEDED.
	ErrNotSeeded = refusal.ErrPolicyNotSeeded
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
	return grant(st, g, nodeID, broker, epoch, g.Grant)
}

// GrantAt is Grant with the boot-clock reading now taken once for a batch
// of renewals, after every renewal of the batch was received
// (lease.Grantor.GrantAt).
func GrantAt(st RenewalState, g *lease.Grantor, nodeID, broker string, epoch uint64, now time.Duration) (*waldenv1.RenewLeaseResponse, error) {
	return grant(st, g, nodeID, broker, epoch, func(k lease.Key, ttl, drift time.Duration) error {
		return g.GrantAt(k, ttl, drift, now)
	})
}

func grant(st RenewalState, g *lease.Grantor, nodeID, broker string, epoch uint64, grantFn func(k lease.Key, ttl, drift time.Duration) error) (*waldenv1.RenewLeaseResponse, error) {
	r, err := st.Renewal(broker, epoch)
	if err != nil {
		return nil, err
	}
	if !r.Seeded {
		return nil, ErrNotSeeded
	}
	if !slices.ContainsFunc(r.Voters, func(v *waldenv1.Voter) bool { return v.GetId() == nodeID }) {
		return nil, ErrNotVoter
	}
	if r.FailoverRequested {
		return nil, fmt.Errorf("lease of broker %q at epoch %d not renewed: %w", broker, epoch, refusal.ErrFailoverRequested)
	}
	g.ClusterHorizon(time.Duration(r.LeaseHorizonMs) * time.Millisecond)
	ttl := time.Duration(r.LeaseTTLMs) * time.Millisecond
	drift := time.Duration(r.DriftMarginMs) * time.Millisecond
	if err := grantFn(lease.Key{Broker: broker, Epoch: epoch}, ttl, drift); err != nil {
		return nil, err
	}
	// The voters are shared with every other answer: gRPC only reads them.
	return &waldenv1.RenewLeaseResponse{Epoch: epoch, LeaseTtlMs: r.LeaseTTLMs, CoordinatorId: nodeID,
		ConfIndex: r.ConfIndex, Voters: r.Voters}, nil
}
