package coordclient

import (
	"sync"

	"google.golang.org/grpc"
)

// Conns is a set of client connections by address, each dialled (lazily, as
// grpc.NewClient does) on first use. It is safe for concurrent use.
type Conns struct {
	dialOpts []grpc.DialOption

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewConns returns an empty set that dials with dialOpts.
func NewConns(dialOpts ...grpc.DialOption) *Conns {
	return &Conns{dialOpts: dialOpts, conns: map[string]*grpc.ClientConn{}}
}

// Get returns the connection to addr, creating it on first use. Its error
// is grpc.NewClient's, for the caller to wrap.
func (c *Conns) Get(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	conn, err := grpc.NewClient(addr, c.dialOpts...)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = conn
	return conn, nil
}

// Close closes every connection; the set stays usable.
func (c *Conns) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, conn := range c.conns {
		_ = conn.Close()
		delete(c.conns, a)
	}
}
