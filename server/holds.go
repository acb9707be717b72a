package server

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"walden/detect"
	waldenv1 "walden/proto/walden/v1"
)

// holdInput is what holdReasons looks at: the committed registry and
// policy, the voters, the running recoveries and a wall-clock "now".
type holdInput struct {
	Policy            *waldenv1.Policy
	Voters            []string
	Brokers           []*waldenv1.Broker
	RunningRecoveries int
	NowUnixMs         int64
}

// holdReasons explains, for every broker that some coordinator observes
// suspect or dead but that is not failed over, which of the decision's
// conditions (DESIGN.md step 3) do not hold yet, in a sentence each.
//
// It is for people (the web view, waldenctl failover --dry-run) and is an
// estimate from the replicated state: the times are the observers' wall
// clocks, while the leader decides with durations on its own monotonic
// clock, counted from when it saw the quorum (and never from before its
// election), so the leader may wait longer than shown here.
func holdReasons(in holdInput) map[string][]string {
	p := in.Policy
	quorum := detect.Quorum(p, len(in.Voters))
	type suspected struct {
		b     *waldenv1.Broker
		since []int64 // since_unix_ms of each suspecting voter, ascending
	}
	var cands []suspected
	eligible, byQuorum := 0, 0
	for _, b := range in.Brokers {
		if b.GetFenced() || b.GetMaintenance() {
			if b.GetMaintenance() && anySuspect(b) {
				cands = append(cands, suspected{b: b})
			}
			continue
		}
		eligible++
		var since []int64
		for _, o := range b.GetObservations() {
			if (o.GetState() == detect.StateSuspect || o.GetState() == detect.StateDead) && slices.Contains(in.Voters, o.GetObserverId()) {
				since = append(since, o.GetSinceUnixMs())
			}
		}
		if len(since) == 0 && !anySuspect(b) {
			continue
		}
		sort.Slice(since, func(i, j int) bool { return since[i] < since[j] })
		if len(since) >= quorum {
			byQuorum++
		}
		cands = append(cands, suspected{b: b, since: since})
	}
	frozen := byQuorum >= 2 && float64(byQuorum) > p.GetMaxFailedFraction()*float64(eligible)
	out := map[string][]string{}
	for _, c := range cands {
		b := c.b
		var why []string
		if b.GetMaintenance() {
			out[b.GetBrokerId()] = []string{"in maintenance: automatic failover does not apply (waldenctl maintenance off " + b.GetBrokerId() + ")"}
			continue
		}
		if n := len(c.since); n < quorum {
			why = append(why, fmt.Sprintf("suspected by %d of the %d coordinators needed (suspicion_quorum)", n, quorum))
		} else {
			timeout := time.Duration(p.GetFailureTimeoutMs()) * time.Millisecond
			if leftGracefully(b) {
				timeout += time.Duration(p.GetRestartGraceMs()) * time.Millisecond
			}
			// The quorum formed when its quorum-th member began to suspect.
			formed := c.since[quorum-1]
			if held := time.Duration(in.NowUnixMs-formed) * time.Millisecond; held < timeout {
				why = append(why, fmt.Sprintf("suspected by a quorum for %s of failure_timeout %s (about %s to go)",
					roundMs(held), roundMs(timeout), roundMs(timeout-held)))
			}
		}
		if ms := b.GetLeaseRemainingMs(); ms > 0 {
			why = append(why, fmt.Sprintf("its lease is valid for %s more, plus the drift margin of %s",
				roundMs(time.Duration(ms)*time.Millisecond), roundMs(time.Duration(p.GetDriftMarginMs())*time.Millisecond)))
		}
		if frozen {
			why = append(why, fmt.Sprintf("automatic failover is frozen: %d of %d brokers look failed at once (max_failed_fraction %g)",
				byQuorum, eligible, p.GetMaxFailedFraction()))
		}
		if max := int(p.GetMaxConcurrentRecoveries()); max > 0 && in.RunningRecoveries >= max {
			why = append(why, fmt.Sprintf("%d recoveries are running, the most max_concurrent_recoveries allows", in.RunningRecoveries))
		}
		if b.GetCooldownBlocked() {
			why = append(why, "recovered within the cooldown: waits for waldenctl ack "+b.GetBrokerId())
		}
		if p.GetDryRun() {
			why = append(why, "the policy is dry_run: a decision is only recorded")
		}
		if len(why) == 0 {
			why = append(why, "every condition holds: the leader decides at its next evaluation")
		}
		out[b.GetBrokerId()] = why
	}
	return out
}

func anySuspect(b *waldenv1.Broker) bool {
	for _, o := range b.GetObservations() {
		if o.GetState() != detect.StateAlive {
			return true
		}
	}
	return false
}

func leftGracefully(b *waldenv1.Broker) bool {
	if b.GetLeftGracefully() {
		return true
	}
	for _, o := range b.GetObservations() {
		if strings.HasPrefix(o.GetReason(), "gossip: left") {
			return true
		}
	}
	return false
}

// roundMs shows a duration rounded to milliseconds, tenths above a second.
func roundMs(d time.Duration) string {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
