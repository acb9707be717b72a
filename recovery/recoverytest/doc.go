// Package recoverytest is test support for recovery targets and the
// executor: an in-process replicated state that coordinators propose to,
// without raft, so that a test drives recovery jobs through the real state
// machine (package fsm) and the real executor.
//
// It must never be imported by product code.
package recoverytest
