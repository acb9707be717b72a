package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

// What an older walden wrote names its states, steps, roles and kinds with
// strings (the deprecated fields of proto/walden/v1); this walden keeps and
// writes only the enums. The two functions below are where the state
// machine reads the strings: every entry is applied, and every snapshot
// restored, in this version's form.

// upgradeCommand returns cmd in this version's form: an entry of an older
// walden carries the deprecated strings instead of the enums (in
// ObserveBroker, DeclareFailed's evidence, RecordEvent, CheckpointJob and
// FinishJob). cmd itself is left as it is; a string that names no value is
// refused as an invalid argument, naming the field.
func upgradeCommand(cmd *waldenv1.Command) (*waldenv1.Command, error) {
	op := namedOp(cmd)
	if op == nil || !waldenv1.HasLegacy(op) {
		return cmd, nil
	}
	cmd = clone(cmd)
	if err := waldenv1.UpgradeLegacy(cmd); err != nil {
		return nil, invalid("%s: %v", commandName(cmd), err)
	}
	return cmd, nil
}

// PrepareProposal completes cmd, about to be proposed; raftnode calls it
// (Config.PrepareProposal) on its own copy of every command:
//
//   - it sets the level of the checks the entry is applied with
//     (Command.checks, this version's Checks; see checks.go);
//   - it adds the deprecated strings beside the enums (waldenv1.AddLegacy),
//     so that a member of an older walden, which reads only the strings,
//     applies the entry as this version does while a cluster is upgraded
//     one member at a time (otherwise it would refuse an observation or a
//     job's end that the others apply, and the members' states, fencing
//     tokens included, would part). This version reads the enums and
//     ignores the strings. To be dropped in the release after the one that
//     introduced the enums: from then on no member of a cluster reads only
//     the strings.
func PrepareProposal(cmd *waldenv1.Command) {
	cmd.Checks = Checks
	if op := namedOp(cmd); op != nil {
		waldenv1.AddLegacy(op)
	}
}

// namedOp returns the operation of cmd when it is one that names a state,
// step or kind, or nil.
func namedOp(cmd *waldenv1.Command) proto.Message {
	switch o := cmd.GetOp().(type) {
	case *waldenv1.Command_ObserveBroker:
		return o.ObserveBroker
	case *waldenv1.Command_DeclareFailed:
		return o.DeclareFailed
	case *waldenv1.Command_RecordEvent:
		return o.RecordEvent
	case *waldenv1.Command_CheckpointJob:
		return o.CheckpointJob
	case *waldenv1.Command_FinishJob:
		return o.FinishJob
	}
	return nil
}

// commandName names the operation of cmd for a refusal.
func commandName(cmd *waldenv1.Command) string {
	switch cmd.GetOp().(type) {
	case *waldenv1.Command_ObserveBroker:
		return fmt.Sprintf("observe broker %q", cmd.GetObserveBroker().GetBrokerId())
	case *waldenv1.Command_DeclareFailed:
		return fmt.Sprintf("declare broker %q failed", cmd.GetDeclareFailed().GetBrokerId())
	case *waldenv1.Command_RecordEvent:
		return "record event"
	case *waldenv1.Command_CheckpointJob:
		return fmt.Sprintf("checkpoint job %s", cmd.GetCheckpointJob().GetJobId())
	case *waldenv1.Command_FinishJob:
		return fmt.Sprintf("finish job %s", cmd.GetFinishJob().GetJobId())
	}
	return "command"
}

// upgradeSnapshot rewrites snap, of any version Restore reads, into this
// version's form: the deprecated strings of versions 1 and 2 set the enums,
// and a member without a role, a voter in those versions, is a voter. A
// string that names no value makes the snapshot invalid.
func upgradeSnapshot(snap *waldenv1.StateSnapshot) error {
	if err := waldenv1.UpgradeLegacy(snap); err != nil {
		return fmt.Errorf("fsm: restore: %w: version %d: %v", ErrInvalidSnapshot, snap.GetVersion(), err)
	}
	for _, m := range snap.GetMembers() {
		if m.GetMemberRole() == waldenv1.MemberRole_MEMBER_ROLE_UNSPECIFIED {
			m.MemberRole = waldenv1.MemberRole_MEMBER_ROLE_VOTER
		}
	}
	return nil
}

// UpgradeSnapshot decodes a snapshot of any version this walden restores
// and returns it in this version's form (version 3, the enums set): for
// tools that edit a snapshot (backup's restore) before Restore reads it.
func UpgradeSnapshot(data []byte) (*waldenv1.StateSnapshot, error) {
	snap := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, snap); err != nil {
		return nil, fmt.Errorf("fsm: restore: %w: %v", ErrInvalidSnapshot, err)
	}
	if err := checkSnapshotVersion(snap); err != nil {
		return nil, err
	}
	if err := upgradeSnapshot(snap); err != nil {
		return nil, err
	}
	snap.Version = snapshotVersion
	return snap, nil
}
