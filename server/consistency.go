package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"strconv"
)

// Metadata of read consistency (etcdctl's --consistency).
const (
	// HeaderConsistency selects a read's consistency: "l" (linearizable, the
	// default) confirms with a ReadIndex round that the answering member's
	// state includes every entry committed before the read; "s"
	// (serializable) answers from the member's state as it is, fast and
	// possibly stale.
	HeaderConsistency = "walden-consistency"
	// TrailerAnsweredBy and TrailerAppliedIndex name, on a serializable
	// read, the member that answered and the raft index its state reflects.
	TrailerAnsweredBy   = "walden-answered-by"
	TrailerAppliedIndex = "walden-applied-index"
)

// linearizable reports whether the incoming read asks for linearizable
// consistency (the default), or an InvalidArgument error for an unknown
// value.
func linearizable(ctx context.Context) (bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	switch v := md.Get(HeaderConsistency); {
	case len(v) == 0 || v[0] == "" || v[0] == "l":
		return true, nil
	case v[0] == "s":
		return false, nil
	default:
		return false, status.Errorf(codes.InvalidArgument, "consistency: %q is not l (linearizable) or s (serializable)", v[0])
	}
}

// read prepares the answer of a read from this member's state: for a
// linearizable read it waits until the state reflects every entry
// committed before the call (a member cut off from the majority answers
// Unavailable instead of stale state); for a serializable read it names
// this member and its applied index in the trailers.
func (d *serviceDeps) read(ctx context.Context) error {
	lin, err := linearizable(ctx)
	if err != nil {
		return err
	}
	if lin {
		if err := d.node.LinearizableRead(ctx); err != nil {
			return d.stateErr(ctx, err)
		}
		return nil
	}
	st := d.node.Status()
	_ = grpc.SetTrailer(ctx, metadata.Pairs(TrailerAnsweredBy, st.NodeID, TrailerAppliedIndex, strconv.FormatUint(st.AppliedIndex, 10)))
	return nil
}
