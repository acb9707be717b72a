package raftnode

import (
	"sync/atomic"
	"time"

	"walden/raftlog"
)

// RaftID is the numeric raft id of the member named memberID: the first 8
// bytes of SHA-256(memberID), big-endian, never zero (raft reserves 0 for
// "none"; a zero hash maps to 1). Every member derives the same id from the
// same name, so ids need no coordination. It is the id the storage records
// (raftlog.RaftID).
func RaftID(memberID string) uint64 { return raftlog.RaftID(memberID) }

// requestIDs generates the request ids of one member's proposals: the high
// 16 bits are a hash of the member id, the low 48 bits a counter seeded from
// the start time, so ids stay unique across restarts of the same member and
// across members.
type requestIDs struct {
	prefix uint64
	next   atomic.Uint64
}

const requestCounterBits = 48

func newRequestIDs(memberID string, now time.Time) *requestIDs {
	g := &requestIDs{prefix: (RaftID(memberID) & 0xffff) << requestCounterBits}
	g.next.Store(uint64(now.UnixNano()))
	return g
}

// Next returns a new request id, never zero.
func (g *requestIDs) Next() uint64 {
	for {
		id := g.prefix | (g.next.Add(1) & (1<<requestCounterBits - 1))
		if id != 0 {
			return id
		}
	}
}
