// Package e2e holds the end-to-end tests: walden as real processes on
// loopback (package internal/devcluster starts them), killed for real — kill
// -9 of a broker under load, a SIGSTOPped zombie broker, killing the
// recovery's executor and the raft leader during a failover, restarting the
// killed broker — with versitygw as the object store.
package e2e
