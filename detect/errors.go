package detect

import "errors"

// ErrNotLeader is returned by leader-only operations (lease renewal, lease
// queries) on a member that is not the raft leader.
var ErrNotLeader = errors.New("detect: not the leader")

// ErrProbe is wrapped by every failed direct probe of an agent.
var ErrProbe = errors.New("detect: probe failed")
