package raftnode_test

import (
	"walden/internal/testutil"
	"walden/raftnode"
)

// The helpers of the internal tests, under the names the tests use.
var (
	testLogger = raftnode.TestLogger
	noop       = raftnode.Noop
	copyTree   = testutil.CopyTree
	waitFor    = testutil.EventuallyTrue
)
