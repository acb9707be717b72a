package sim

// Profile is a named choice of faults: each aims at one way the protocol
// could let an agent hold a lease after its WAL may be read, or lose a lease
// that a healthy majority should keep.
type Profile struct {
	Name   string
	Faults Faults
}

// Profiles are the fault profiles `make simulate` runs, all faults last.
func Profiles() []Profile {
	return []Profile{
		{"manual-failover-after-election", Faults{LeaderChanges: true, ManualFailovers: true}},
		{"config-files-differ", Faults{LeaderChanges: true, NetworkFaults: true, ConfigDrift: true}},
		{"runtime-policy-changes", Faults{LeaderChanges: true, NetworkFaults: true, PolicyChanges: true}},
		{"host-suspend", Faults{Suspends: true}},
		{"leader-changes-and-stalls", Faults{LeaderChanges: true, NetworkFaults: true, Stalls: true}},
		{"restarts", Faults{Restarts: true, NetworkFaults: true}},
		{"restarts-and-manual-failovers", Faults{Restarts: true, ManualFailovers: true, LeaderChanges: true}},
		{"degraded-network", Faults{NetworkFaults: true}},
		{"replace-same-name", Faults{Replacements: true, PolicyChanges: true, NetworkFaults: true, ManualFailovers: true}},
		{"replacement-script", Faults{ReplacementScript: true}},
		{"restore", Faults{Restore: true, LeaderChanges: true, NetworkFaults: true, ManualFailovers: true}},
		{"force-new-cluster", Faults{ForceNewCluster: true, LeaderChanges: true, NetworkFaults: true, ManualFailovers: true}},
		{"all", AllFaults()},
	}
}
