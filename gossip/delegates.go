package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// The memberlist callbacks of a Pool. Every one of them runs on a memberlist
// goroutine, often with memberlist's node table locked: they take only the
// Pool's own short locks, never call back into memberlist, and never wait for
// the consumer.

// delegate answers memberlist's Delegate: only NodeMeta is used.
type delegate struct{ p *Pool }

func (d delegate) NodeMeta(limit int) []byte {
	d.p.metaMu.Lock()
	defer d.p.metaMu.Unlock()
	if len(d.p.metaBytes) > limit {
		// Encode checked MetaMaxSize, which is the limit memberlist passes.
		return nil
	}
	return d.p.metaBytes
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// eventDelegate turns memberlist's EventDelegate and PingDelegate calls into
// queued events.
type eventDelegate struct{ p *Pool }

func (d eventDelegate) NotifyJoin(n *memberlist.Node) {
	d.p.enqueue(EventJoin, n, StateAlive, 0)
}

func (d eventDelegate) NotifyLeave(n *memberlist.Node) {
	// memberlist v0.7.0 passes the embedded Node, whose State field it never
	// sets: dead and left are told apart by the Leaving flag the member
	// gossiped in its metadata just before leaving.
	state := StateDead
	if m, err := DecodeMeta(n.Meta); err == nil && m.Leaving {
		state = StateLeft
	}
	d.p.enqueue(EventLeave, n, state, 0)
}

func (d eventDelegate) NotifyUpdate(n *memberlist.Node) {
	d.p.enqueue(EventUpdate, n, StateAlive, 0)
}

func (d eventDelegate) AckPayload() []byte { return nil }

func (d eventDelegate) NotifyPingComplete(n *memberlist.Node, rtt time.Duration, _ []byte) {
	d.p.enqueue(EventPing, n, StateAlive, rtt)
}

// clusterGuard refuses members of another cluster: AliveDelegate for every
// alive message (gossip and push/pull), MergeDelegate for a join's push/pull.
type clusterGuard struct{ p *Pool }

func (g clusterGuard) NotifyAlive(n *memberlist.Node) error {
	return g.p.checkMember(n, "alive")
}

func (g clusterGuard) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if err := g.p.checkMember(n, "merge"); err != nil {
			return err
		}
	}
	return nil
}

// logWriter turns memberlist's "[LEVEL] memberlist: text" lines into slog
// records with component=memberlist.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for _, l := range []struct {
		prefix string
		level  slog.Level
	}{
		{"[DEBUG]", slog.LevelDebug},
		{"[INFO]", slog.LevelInfo},
		{"[WARN]", slog.LevelWarn},
		{"[ERR]", slog.LevelError},
		{"[ERROR]", slog.LevelError},
	} {
		if rest, ok := strings.CutPrefix(line, l.prefix); ok {
			level, line = l.level, strings.TrimSpace(rest)
			break
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	ctx := context.Background()
	if w.log.Enabled(ctx, level) {
		w.log.Log(ctx, level, line, "component", "memberlist")
	}
	return len(p), nil
}

func nodeAddr(n *memberlist.Node) string {
	if n.Addr == nil {
		return ""
	}
	return n.Address()
}

func describeMeta(b []byte) string {
	m, err := DecodeMeta(b)
	if err != nil {
		return fmt.Sprintf("undecodable metadata (%d bytes)", len(b))
	}
	return fmt.Sprintf("cluster %q", m.ClusterName)
}
