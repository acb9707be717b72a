package lease

import (
	"slices"
	"time"
)

// Grant is one coordinator's answer to a renewal, as the agent records it.
type Grant struct {
	// Coordinator is the granting member's id.
	Coordinator string
	// Epoch is the broker epoch the grant is for.
	Epoch uint64
	// Sent is the agent's boot-clock reading taken just before the renewal
	// was sent: the grant lives until Sent + TTL - margin.
	Sent time.Duration
	// TTL is the lease the coordinator granted.
	TTL time.Duration
}

// Voters is a voter configuration as a coordinator reported it.
type Voters struct {
	// IDs are the voting members' ids.
	IDs []string
	// Incarnations are the voters' incarnations, in the order of IDs (nil
	// or short: 0, what an older coordinator reports). A member removed
	// and added again under its name is a new incarnation: it knows
	// nothing of the old one's grants, so a grant counts only for the
	// incarnation that made it.
	Incarnations []uint64
	// Index is the raft index of the configuration (the last membership
	// change applied); a higher index is a newer configuration.
	Index uint64
}

// incarnation returns the incarnation of voter i.
func (v Voters) incarnation(i int) uint64 {
	if i < len(v.Incarnations) {
		return v.Incarnations[i]
	}
	return 0
}

// incarnationOf returns the incarnation of the voter id (0 if not listed).
func (v Voters) incarnationOf(id string) uint64 {
	if i := slices.Index(v.IDs, id); i >= 0 {
		return v.incarnation(i)
	}
	return 0
}

// member is a coordinator's incarnation: grants are counted by it.
type member struct {
	id          string
	incarnation uint64
}

// Holder is the agent's side of a quorum lease for one broker: the grants
// of the current epoch and the newest voter configuration it was told. It is
// not safe for concurrent use; the agent guards it.
type Holder struct {
	margin time.Duration
	epoch  uint64
	voters Voters
	known  bool
	grants map[member]Grant // by coordinator incarnation, current epoch only
}

// NewHolder returns a holder that subtracts margin from every grant.
func NewHolder(margin time.Duration) *Holder {
	return &Holder{margin: margin, grants: map[member]Grant{}}
}

// SetEpoch starts a new epoch: every grant of another epoch is dropped,
// and so is the voter configuration known, which the new epoch's first
// grant tells again, as to an agent that just started. A registration may
// be with another cluster than the last grants' — one restored from a
// backup, whose configuration's index is not beyond the old one's and
// whose members are new incarnations: kept, the old configuration would
// refuse every grant of the new cluster. (The epoch was registered after
// every voter change the cluster committed before it, so no former
// incarnation removed by then can grant it.)
func (h *Holder) SetEpoch(epoch uint64) {
	if epoch != h.epoch {
		h.epoch = epoch
		clear(h.grants)
		h.voters, h.known = Voters{}, false
	}
}

// Epoch returns the current epoch.
func (h *Holder) Epoch() uint64 { return h.epoch }

// Revoke drops every grant at once (the cluster refused the epoch).
func (h *Holder) Revoke() { clear(h.grants) }

// Granted records g and the voter configuration that came with it. The
// grant is of the coordinator's incarnation in that configuration, and
// counts only while the known configuration lists the same incarnation. A
// grant of another epoch is ignored; of an incarnation's grants the one
// sent last is kept. A configuration replaces the known one only when it is
// newer.
func (h *Holder) Granted(g Grant, v Voters) {
	if v.Index > h.voters.Index || !h.known {
		if len(v.IDs) > 0 {
			h.voters = Voters{IDs: slices.Clone(v.IDs), Index: v.Index}
			for i := range v.IDs {
				h.voters.Incarnations = append(h.voters.Incarnations, v.incarnation(i))
			}
			h.known = true
		}
	}
	if g.Epoch != h.epoch {
		return
	}
	k := member{id: g.Coordinator, incarnation: v.incarnationOf(g.Coordinator)}
	if cur, ok := h.grants[k]; ok && cur.Sent > g.Sent {
		return
	}
	h.grants[k] = g
}

// Lost drops coordinator's grants, of every incarnation (it refused to
// renew, so what it granted before no longer counts for anything it says
// next).
func (h *Holder) Lost(coordinator string) {
	for k := range h.grants {
		if k.id == coordinator {
			delete(h.grants, k)
		}
	}
}

// Voters returns the newest voter configuration known.
func (h *Holder) Voters() Voters { return h.voters }

// Valid reports whether the lease is valid at now (a boot-clock reading of
// the agent) and how long it stays valid without another grant: a majority
// of the known voters must hold a grant whose Sent + TTL - margin is after
// now. Valid is false while no voter configuration is known.
func (h *Holder) Valid(now time.Duration) (bool, time.Duration) {
	until := h.until()
	if until <= now {
		return false, 0
	}
	return true, until - now
}

// until is the end of validity: the majority-th latest deadline among the
// voters' grants (0 when there are fewer grants than a majority).
func (h *Holder) until() time.Duration {
	if !h.known {
		return 0
	}
	var deadlines []time.Duration
	for i, id := range h.voters.IDs {
		if g, ok := h.grants[member{id: id, incarnation: h.voters.incarnation(i)}]; ok {
			deadlines = append(deadlines, g.Sent+g.TTL-h.margin)
		}
	}
	need := len(h.voters.IDs)/2 + 1
	if len(deadlines) < need {
		return 0
	}
	slices.Sort(deadlines)
	slices.Reverse(deadlines)
	return deadlines[need-1]
}

// Live returns, per voter, how long its grant stays live at now (0 or less:
// expired; missing: none).
func (h *Holder) Live(now time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for i, id := range h.voters.IDs {
		if g, ok := h.grants[member{id: id, incarnation: h.voters.incarnation(i)}]; ok {
			out[id] = g.Sent + g.TTL - h.margin - now
		}
	}
	return out
}
