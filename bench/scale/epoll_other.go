//go:build !linux

package main

import (
	"context"
	"errors"
	"time"
)

// renewLoop is transport frames-epoll's, which needs Linux's epoll.
type renewLoop struct{}

func newRenewLoop(*loadProc) (*renewLoop, error) {
	return nil, errors.New("load: the frames-epoll transport needs Linux")
}

func (*renewLoop) run() {}

func (*renewLoop) renew(context.Context, *simAgent, uint64, time.Duration) bool { return false }
