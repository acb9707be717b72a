package server

import (
	"crypto/sha256"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"walden/authz"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
	"walden/version"
)

// snapshotChunk is the data size of one message of a Snapshot stream.
const snapshotChunk = 1 << 20

// snapshotState is what the Maintenance service reads (*fsm.State).
type snapshotState interface {
	Snapshot() ([]byte, error)
}

// maintenanceService implements walden.v1.Maintenance: backups of the
// replicated state, served by the leader.
type maintenanceService struct {
	waldenv1.UnimplementedMaintenanceServer
	d     *serviceDeps
	state snapshotState
}

// Snapshot streams the leader's state after a linearizable read: every
// entry committed before the call is in it.
func (m *maintenanceService) Snapshot(_ *waldenv1.SnapshotRequest, stream grpc.ServerStreamingServer[waldenv1.SnapshotChunk]) error {
	ctx := stream.Context()
	leader, st := m.d.isLeader()
	if !leader {
		if st.LeaderID == "" {
			return rpcerr.NewPlain(refusal.NoLeader, "no leader: a snapshot is taken on the leader", nil)
		}
		return m.d.admin.notLeader(ctx, st.LeaderID, adminAddrOf(st, st.LeaderID))
	}
	if err := m.d.node.LinearizableRead(ctx); err != nil {
		return m.d.stateErr(ctx, err)
	}
	data, err := m.state.Snapshot()
	if err != nil {
		return status.Errorf(codes.Internal, "take the snapshot: %v", err)
	}
	ss := &waldenv1.StateSnapshot{}
	if err := proto.Unmarshal(data, ss); err != nil {
		return status.Errorf(codes.Internal, "read the snapshot: %v", err)
	}
	h := &waldenv1.SnapshotHeader{
		ClusterName: ss.GetClusterName(), Index: ss.GetAppliedIndex(), Term: st.Term, NodeId: st.NodeID,
		CreatedUnixMs: time.Now().UnixMilli(), Size: uint64(len(data)), WaldenVersion: version.Get().Version,
		Members: st.Members, Brokers: uint32(len(ss.GetBrokers())), Streams: uint32(len(ss.GetStreams())),
		Objects: uint32(len(ss.GetObjects())), Jobs: uint32(len(ss.GetJobs())),
	}
	if err := stream.Send(&waldenv1.SnapshotChunk{Part: &waldenv1.SnapshotChunk_Header{Header: h}}); err != nil {
		return err
	}
	for off := 0; off < len(data); off += snapshotChunk {
		end := min(off+snapshotChunk, len(data))
		if err := stream.Send(&waldenv1.SnapshotChunk{Part: &waldenv1.SnapshotChunk_Data{Data: data[off:end]}}); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(data)
	if err := stream.Send(&waldenv1.SnapshotChunk{Part: &waldenv1.SnapshotChunk_Sha256{Sha256: sum[:]}}); err != nil {
		return err
	}
	m.d.logger.InfoContext(ctx, "snapshot served", "index", h.GetIndex(), "term", h.GetTerm(), "bytes", len(data),
		"brokers", h.GetBrokers(), "streams", h.GetStreams(), "objects", h.GetObjects(), "actor", authz.Actor(ctx))
	return nil
}
