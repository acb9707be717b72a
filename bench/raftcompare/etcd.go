package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.uber.org/zap"
)

// etcdCluster is a 3-member etcd cluster embedded in this process, with
// etcd's defaults (fsync of the WAL on every Ready, 100 ms heartbeat, 1 s
// election timeout) except for quieter logs and no HTTP gateway.
type etcdCluster struct {
	logLevel zap.AtomicLevel // error while running, raised on Close
	members  []*embed.Etcd
	leader   *etcdserver.EtcdServer
	keys     [][]byte // one key per worker, so the keyspace stays small
}

// startEtcd starts size members with data directories under dir and waits
// until they serve and have a leader.
func startEtcd(ctx context.Context, dir string, size int, maxWorkers int) (*etcdCluster, error) {
	peerURLs := make([]url.URL, size)
	clientURLs := make([]url.URL, size)
	initial := make([]string, size)
	for i := range size {
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		peerURLs[i] = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		clientURLs[i] = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		initial[i] = fmt.Sprintf("e%d=%s", i, peerURLs[i].String())
	}

	logLevel := zap.NewAtomicLevelAt(zap.ErrorLevel)
	zcfg := zap.NewProductionConfig()
	zcfg.Level = logLevel
	zcfg.Sampling = nil
	zcfg.OutputPaths = []string{"stderr"}
	zcfg.ErrorOutputPaths = []string{"stderr"}
	lg, err := zcfg.Build()
	if err != nil {
		return nil, fmt.Errorf("raftcompare: etcd logger: %w", err)
	}

	type started struct {
		i   int
		e   *embed.Etcd
		err error
	}
	ch := make(chan started, size)
	for i := range size {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("e%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cfg.ListenPeerUrls = []url.URL{peerURLs[i]}
		cfg.AdvertisePeerUrls = []url.URL{peerURLs[i]}
		cfg.ListenClientUrls = []url.URL{clientURLs[i]}
		cfg.AdvertiseClientUrls = []url.URL{clientURLs[i]}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "walden-bench"
		cfg.ClusterState = embed.ClusterStateFlagNew
		cfg.Logger = "zap"
		cfg.LogLevel = "error"
		cfg.LogOutputs = []string{"stderr"}
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.With(zap.String("member", cfg.Name)))
		cfg.EnableGRPCGateway = false
		// Members start concurrently: each waits for its peers.
		go func() {
			e, err := embed.StartEtcd(cfg)
			ch <- started{i: i, e: e, err: err}
		}()
	}
	c := &etcdCluster{logLevel: logLevel, members: make([]*embed.Etcd, size)}
	var errs []error
	for range size {
		s := <-ch
		if s.err != nil {
			errs = append(errs, fmt.Errorf("raftcompare: start etcd member e%d: %w", s.i, s.err))
			continue
		}
		c.members[s.i] = s.e
	}
	if len(errs) > 0 {
		_ = c.Close()
		return nil, errors.Join(errs...)
	}
	for i, e := range c.members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			_ = c.Close()
			return nil, fmt.Errorf("raftcompare: etcd member e%d: %w", i, err)
		case <-time.After(30 * time.Second):
			_ = c.Close()
			return nil, fmt.Errorf("raftcompare: etcd member e%d not ready after 30s", i)
		}
	}
	if err = c.FindLeader(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	c.keys = make([][]byte, maxWorkers)
	for w := range c.keys {
		c.keys[w] = fmt.Appendf(nil, "bench/%04d", w)
	}
	return c, nil
}

func (c *etcdCluster) Name() string { return "etcd" }

// FindLeader waits until one member considers itself the leader.
func (c *etcdCluster) FindLeader(ctx context.Context) error {
	err := waitFor(ctx, 30*time.Second, func() bool {
		for _, e := range c.members {
			if e.Server.Leader() != 0 && e.Server.Leader() == e.Server.MemberID() {
				c.leader = e.Server
				return true
			}
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("%w: etcd: %w", errNoLeader, err)
	}
	return nil
}

// Propose puts payload under the worker's key on the leader's EtcdServer,
// which returns once the request is committed and applied.
func (c *etcdCluster) Propose(ctx context.Context, worker int, payload []byte) error {
	_, err := c.leader.Put(ctx, &pb.PutRequest{Key: c.keys[worker], Value: payload})
	return err
}

// Close stops every member, one at a time and the current leader first, so
// that each one's leadership transfer on shutdown finds a live peer. Members
// log the closing of their listeners as errors; those are expected here and
// silenced.
func (c *etcdCluster) Close() error {
	c.logLevel.SetLevel(zap.FatalLevel)
	for range c.members {
		next := -1
		for i, e := range c.members {
			if e == nil {
				continue
			}
			if next < 0 || e.Server.Leader() == e.Server.MemberID() {
				next = i
			}
		}
		if next < 0 {
			break
		}
		c.members[next].Close()
		c.members[next] = nil
	}
	return nil
}

// freePort asks the kernel for an unused port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("raftcompare: find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
