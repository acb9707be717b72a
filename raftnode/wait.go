package raftnode

import (
	"sync"

	waldenv1 "walden/proto/walden/v1"
)

// applied is what the apply path hands to a waiting proposer.
type applied struct {
	result *waldenv1.Result
	err    error
}

// waitRegistry wakes proposers when their entry is applied. A proposer
// registers its request id before proposing; the apply path triggers the id
// with the result. Triggering an id nobody waits for (another member's
// proposal, a proposer that gave up) does nothing.
type waitRegistry struct {
	mu      sync.Mutex
	waiters map[uint64]chan applied
}

func newWaitRegistry() *waitRegistry {
	return &waitRegistry{waiters: make(map[uint64]chan applied)}
}

// Register returns the channel that receives the outcome of request id. It
// returns nil if id is already registered.
func (w *waitRegistry) Register(id uint64) <-chan applied {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.waiters[id]; ok {
		return nil
	}
	ch := make(chan applied, 1)
	w.waiters[id] = ch
	return ch
}

// Cancel forgets request id; a later Trigger finds no waiter.
func (w *waitRegistry) Cancel(id uint64) {
	w.mu.Lock()
	delete(w.waiters, id)
	w.mu.Unlock()
}

// Trigger delivers the outcome of request id to its waiter, if any, and
// reports whether there was one.
func (w *waitRegistry) Trigger(id uint64, a applied) bool {
	w.mu.Lock()
	ch, ok := w.waiters[id]
	delete(w.waiters, id)
	w.mu.Unlock()
	if ok {
		ch <- a // buffered, never blocks
	}
	return ok
}

// FailAll delivers err to every waiter (the node stopped).
func (w *waitRegistry) FailAll(err error) {
	w.mu.Lock()
	waiters := w.waiters
	w.waiters = make(map[uint64]chan applied)
	w.mu.Unlock()
	for _, ch := range waiters {
		ch <- applied{err: err}
	}
}

// Len is the number of waiting proposers.
func (w *waitRegistry) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiters)
}

// indexWaiter wakes readers once the applied index reaches the index they
// wait for (linearizable reads after ReadIndex).
type indexWaiter struct {
	mu      sync.Mutex
	applied uint64
	waiters map[uint64][]chan struct{}
}

func newIndexWaiter(applied uint64) *indexWaiter {
	return &indexWaiter{applied: applied, waiters: make(map[uint64][]chan struct{})}
}

// Wait returns a channel closed once the applied index is at least index.
func (w *indexWaiter) Wait(index uint64) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.applied >= index {
		close(ch)
		return ch
	}
	w.waiters[index] = append(w.waiters[index], ch)
	return ch
}

// Applied records that every entry up to index is applied.
func (w *indexWaiter) Applied(index uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if index <= w.applied {
		return
	}
	w.applied = index
	for i, chs := range w.waiters {
		if i <= index {
			for _, ch := range chs {
				close(ch)
			}
			delete(w.waiters, i)
		}
	}
}
