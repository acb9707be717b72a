package history

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/loadgen"
	waldenv1 "walden/proto/walden/v1"
	"walden/refusal"
	"walden/rpcerr"
)

// Kinds of operations.
const (
	KindAppend = "append"
	KindRead   = "read"
	KindStream = "stream" // a stream's state read from the catalog
	KindBroker = "broker" // a broker's registry entry read from the catalog
	KindLease  = "lease"  // an agent's lease answer (GET /v1/lease)
)

// Outcomes of an append.
const (
	// Ok: acknowledged at [Base, Base+len(IDs)).
	Ok = "ok"
	// Refused: refused before anything was written (NOT_OWNER, NOT_READY,
	// WAL_FULL, UNKNOWN_PRODUCER, OUT_OF_ORDER_SEQUENCE, an invalid
	// request, a connection never made).
	Refused = "refused"
	// Maybe: refused by the broker after it may have written the records
	// (LEASE_INVALID, NODE_FENCED, SHUTTING_DOWN): they may be in the
	// stream; the answer came back, so not later than it.
	Maybe = "maybe"
	// Unknown: no answer (timeout, connection lost): the records may be in
	// the stream, even later than the client gave up.
	Unknown = "unknown"
)

// Op is one client operation. Times are nanoseconds since the recorder
// started, on the recording process's monotonic clock.
type Op struct {
	Kind   string `json:"kind"`
	Call   int64  `json:"call_ns"`
	Return int64  `json:"return_ns"`
	// Stream is the stream of an append, read or stream observation.
	Stream uint64 `json:"stream,omitempty"`
	// Broker names the broker that answered (append, read, lease) or
	// that was observed (broker).
	Broker string `json:"broker,omitempty"`

	// Append: the records' ids; its outcome and refusal reason (or gRPC
	// code); when acknowledged, the offsets and epochs.
	IDs         []string `json:"ids,omitempty"`
	Outcome     string   `json:"outcome,omitempty"`
	Reason      string   `json:"reason,omitempty"`
	Base        uint64   `json:"base,omitempty"`
	StreamEpoch uint64   `json:"stream_epoch,omitempty"`
	BrokerEpoch uint64   `json:"broker_epoch,omitempty"`
	// Duplicate: the broker answered a retry of the producer's last batch
	// with the offsets an earlier attempt stored it at (idempotent
	// producer).
	Duplicate bool `json:"duplicate,omitempty"`
	// Bases are the offsets where an unacknowledged append may have
	// taken effect, found by the check from the reads (not recorded).
	Bases []uint64 `json:"-"`

	// Read: from which offset, how many at most, the ids read (one per
	// offset from From on), and whether the broker answered as the
	// stream's owner (then the answer must reach the stream's end).
	From    uint64   `json:"from,omitempty"`
	Max     uint32   `json:"max,omitempty"`
	ReadIDs []string `json:"read_ids,omitempty"`
	Owner   bool     `json:"owner,omitempty"`

	// Stream observation: state ("opened"/"closed"), epoch, owner and
	// committed end offset. Broker observation: epoch, fenced, state.
	// Lease answer: epoch, valid, fenced.
	State     string `json:"state,omitempty"`
	Epoch     uint64 `json:"epoch,omitempty"`
	OwnerID   string `json:"owner_id,omitempty"`
	EndOffset uint64 `json:"end_offset,omitempty"`
	Fenced    bool   `json:"fenced,omitempty"`
	Valid     bool   `json:"valid,omitempty"`
}

// Recorder collects operations from many goroutines.
type Recorder struct {
	start time.Time
	names map[string]string // broker address → broker id

	mu  sync.Mutex
	ops []Op
}

// NewRecorder starts a history; names maps brokers' API addresses to their
// ids.
func NewRecorder(names map[string]string) *Recorder {
	return &Recorder{start: time.Now(), names: names}
}

// Now is the time since the recorder started, in nanoseconds.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// At converts a wall time to the recorder's time.
func (r *Recorder) At(t time.Time) int64 { return int64(t.Sub(r.start)) }

// Add records op.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Ops returns a copy of the history so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// BrokerName returns the id of the broker at addr (addr itself when
// unknown).
func (r *Recorder) BrokerName(addr string) string {
	if n, ok := r.names[addr]; ok {
		return n
	}
	return addr
}

// Interceptor records every Append, Read, DescribeStream and ListStreams
// and ListBrokers call made through a connection that uses it.
func (r *Recorder) Interceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		call := r.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		ret := r.Now()
		switch q := req.(type) {
		case *waldenv1.AppendRequest:
			r.Add(appendOp(q, reply.(*waldenv1.AppendResponse), err, call, ret, r.BrokerName(cc.Target())))
		case *waldenv1.ReadRequest:
			if err == nil {
				r.Add(readOp(q, reply.(*waldenv1.ReadResponse), call, ret, r.BrokerName(cc.Target())))
			}
		case *waldenv1.DescribeStreamRequest:
			if err == nil {
				r.Add(streamOp(reply.(*waldenv1.DescribeStreamResponse).GetStream(), call, ret))
			}
		case *waldenv1.ListStreamsRequest:
			if err == nil {
				for _, s := range reply.(*waldenv1.ListStreamsResponse).GetStreams() {
					r.Add(streamOp(s, call, ret))
				}
			}
		case *waldenv1.ListBrokersRequest:
			if err == nil {
				for _, b := range reply.(*waldenv1.ListBrokersResponse).GetBrokers() {
					r.Add(Op{Kind: KindBroker, Call: call, Return: ret, Broker: b.GetBrokerId(),
						Epoch: b.GetEpoch(), Fenced: b.GetFenced(), State: b.GetBrokerState().Name()})
				}
			}
		}
		return err
	}
}

func appendOp(q *waldenv1.AppendRequest, resp *waldenv1.AppendResponse, err error, call, ret int64, brokerID string) Op {
	op := Op{Kind: KindAppend, Call: call, Return: ret, Stream: q.GetStreamId(), Broker: brokerID}
	for _, p := range q.GetRecords() {
		op.IDs = append(op.IDs, loadgen.PayloadID(p))
	}
	if err == nil {
		op.Outcome, op.Base, op.StreamEpoch, op.BrokerEpoch = Ok, resp.GetBaseOffset(), resp.GetStreamEpoch(), resp.GetBrokerEpoch()
		op.Duplicate = resp.GetDuplicate()
		return op
	}
	op.Outcome, op.Reason = classify(err)
	return op
}

// classify sorts a failed append: refused before any write, refused after
// a possible write, or unanswered.
func classify(err error) (outcome, reason string) {
	if reason := rpcerr.Reason(err); reason != "" {
		switch reason {
		case refusal.NotOwner, refusal.NotReady, refusal.WALFull,
			refusal.UnknownProducer, refusal.OutOfOrderSequence:
			return Refused, string(reason)
		}
		return Maybe, string(reason)
	}
	st, _ := status.FromError(err)
	switch {
	case st.Code() == codes.InvalidArgument:
		return Refused, st.Code().String()
	case st.Code() == codes.Unavailable && strings.Contains(st.Message(), "while dialing"):
		return Refused, "NOT_CONNECTED"
	case errors.Is(err, context.Canceled) || st.Code() == codes.Canceled:
		return Unknown, codes.Canceled.String()
	}
	return Unknown, st.Code().String()
}

func readOp(q *waldenv1.ReadRequest, resp *waldenv1.ReadResponse, call, ret int64, brokerID string) Op {
	op := Op{Kind: KindRead, Call: call, Return: ret, Stream: q.GetStreamId(), Broker: brokerID,
		From: q.GetFromOffset(), Max: q.GetMaxRecords(), Owner: resp.GetOwnerBrokerId() == brokerID}
	recs := resp.GetRecords()
	if len(recs) > 0 {
		op.From = recs[0].GetOffset()
	}
	for i, rec := range recs {
		if rec.GetOffset() != op.From+uint64(i) {
			// Not consecutive: keep the consecutive part, and do not
			// hold the answer to reaching the end.
			op.Owner = false
			break
		}
		op.ReadIDs = append(op.ReadIDs, loadgen.PayloadID(rec.GetPayload()))
	}
	return op
}

func streamOp(s *waldenv1.Stream, call, ret int64) Op {
	return Op{Kind: KindStream, Call: call, Return: ret, Stream: s.GetStreamId(), State: s.GetState(),
		Epoch: s.GetEpoch(), OwnerID: s.GetOwnerBrokerId(), EndOffset: s.GetEndOffset()}
}

// WriteJSONL writes ops, one JSON object per line.
func WriteJSONL(path string, ops []Op) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range ops {
		if err := enc.Encode(&ops[i]); err != nil {
			f.Close()
			return fmt.Errorf("history: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("history: %w", err)
	}
	return f.Close()
}

// ReadJSONL reads a history WriteJSONL wrote.
func ReadJSONL(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	var ops []Op
	dec := json.NewDecoder(bufio.NewReader(f))
	for dec.More() {
		var op Op
		if err := dec.Decode(&op); err != nil {
			return nil, fmt.Errorf("history: %s: %w", path, err)
		}
		ops = append(ops, op)
	}
	return ops, nil
}
