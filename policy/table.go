package policy

import (
	"fmt"
	"strings"
)

// keyDoc is what the documentation says of one key: the rule its value must
// follow and what it guards against.
type keyDoc struct {
	rule, guards string
}

// docs are the keys' documentation, in Keys order. The table of
// docs/detection.md is generated from it (MarkdownTable; a test fails when
// the page differs), so the keys are described in one place.
var docs = map[string]keyDoc{
	KeyFailureTimeout: {"> 0; **greater than `lease_ttl` + `drift_margin`**",
		"declaring a broker failed on a short blip (GC pause, a lost packet burst, a slow disk): a suspicion quorum must not have heard it this long, counted from the last contact"},
	KeySuspicionQuorum: {"integer ≥ 0; 0 = a majority of the voters; above the number of voters never decides",
		"one coordinator that lost sight of a broker (its own network trouble) failing it over alone"},
	KeyLeaseTTL: {"≥ " + MinLeaseTTL.String(),
		"a broker writing after being fenced: its agent stops acknowledging when a majority of the coordinators have not renewed within this"},
	KeyRestartGrace: {"≥ 0",
		"failing over a broker that announced a graceful restart (agent left the gossip pool) before it had time to come back"},
	KeyMaxConcurrentRecoveries: {"≥ 1",
		"a cascade of recoveries overloading the coordinators or S3 (Kafka fences one at a time, KAFKA-13173)"},
	KeyMaxFailedFraction: {"> 0 and ≤ 1",
		"a mass failover when the coordinators are partitioned or the network misbehaves (k8s #28832): freeze when more than this fraction (and at least 2) of brokers look failed; resume below half of it"},
	KeyCooldown: {"≥ 0",
		"a flapping broker failed over again and again: after a recovery, a new automatic failover within this waits for `waldenctl ack`"},
	KeyDryRun: {"`true` / `false`",
		"surprises while adopting walden: decisions are recorded in the event log with their evidence, nothing is fenced"},
	KeyDriftMargin: {"≥ 0; **at least `2ρ·lease_ttl/(1-ρ)`**, ρ = 0.1 % (7 ms for 3 s)",
		"clock-rate differences between the agents' and the coordinators' clocks: a coordinator attests its grant expired only this long after the grant ended"},
}

// MarkdownTable returns the table of the policy keys — key, default, rule,
// what it guards against — as documented in docs/detection.md. Every
// duration is at most MaxDuration.
func MarkdownTable() string {
	var b strings.Builder
	b.WriteString("| key | default | rule | guards against |\n|---|---|---|---|\n")
	def := Defaults()
	for _, k := range Keys() {
		d := docs[k]
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", k, Format(def, k), d.rule, d.guards)
	}
	return b.String()
}
