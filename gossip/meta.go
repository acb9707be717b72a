package gossip

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/memberlist"
)

// MetaMaxSize is memberlist's limit on the encoded metadata of one member.
const MetaMaxSize = memberlist.MetaMaxSize

// Role says what kind of process a member is.
type Role string

// The roles of a pool member.
const (
	// RoleCoordinator is a `walden server` member; Meta.ID is its
	// coordinator id.
	RoleCoordinator Role = "coordinator"
	// RoleAgent is a broker's agent; Meta.ID is the broker id.
	RoleAgent Role = "agent"
)

// Meta is the metadata a member advertises to the pool.
type Meta struct {
	// Role is RoleCoordinator or RoleAgent.
	Role Role
	// ClusterName is the cluster the member belongs to.
	ClusterName string
	// ID is the coordinator id or the broker id.
	ID string
	// AgentAddr is the agent's "host:port" for direct probes (agents).
	// Optional.
	AgentAddr string
	// AdminAddr is the member's gRPC admin/API "host:port". Optional.
	AdminAddr string
	// Leaving is set by Pool.Leave just before the member announces its
	// departure, so that the others report it as left rather than dead.
	// Never set it yourself.
	Leaving bool
}

// Encoding (version 1), all strings prefixed by their length as a uvarint:
//
//	version u8 (1) | role u8 | flags u8 (bit 0: leaving) |
//	cluster_name | id | agent_addr | admin_addr | [later fields]
//
// A decoder ignores bytes after the fields it knows, so that a later encoder
// may append fields without changing the version.
const (
	metaVersion1 = 1

	roleCodeCoordinator = 1
	roleCodeAgent       = 2

	flagLeaving = 1 << 0

	maxMetaStringLen = 255
)

func roleCode(r Role) (byte, bool) {
	switch r {
	case RoleCoordinator:
		return roleCodeCoordinator, true
	case RoleAgent:
		return roleCodeAgent, true
	}
	return 0, false
}

// validate checks the fields an encoded Meta must have; errors are
// *ConfigError with keys "meta.*".
func (m Meta) validate() error {
	if _, ok := roleCode(m.Role); !ok {
		return invalid("meta.role", "%q is not %q or %q", m.Role, RoleCoordinator, RoleAgent)
	}
	if err := validName("meta.cluster_name", m.ClusterName, maxClusterNameLen); err != nil {
		return err
	}
	if err := validName("meta.id", m.ID, maxMetaStringLen); err != nil {
		return err
	}
	for _, f := range []struct{ key, v string }{{"meta.agent_addr", m.AgentAddr}, {"meta.admin_addr", m.AdminAddr}} {
		if f.v == "" {
			continue
		}
		if len(f.v) > maxMetaStringLen {
			return invalid(f.key, "longer than %d bytes", maxMetaStringLen)
		}
		if err := validHostPort(f.key, f.v); err != nil {
			return err
		}
	}
	if n := m.encodedLen(); n > MetaMaxSize {
		return invalid("meta", "encodes to %d bytes, more than memberlist's limit of %d", n, MetaMaxSize)
	}
	return nil
}

func (m Meta) encodedLen() int {
	n := 3
	for _, s := range []string{m.ClusterName, m.ID, m.AgentAddr, m.AdminAddr} {
		n += uvarintLen(uint64(len(s))) + len(s)
	}
	return n
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// Encode returns the compact binary form of m that memberlist carries.
// It fails with ErrInvalidMeta when a field is missing or malformed and with
// ErrMetaTooLarge when the encoding exceeds MetaMaxSize.
func (m Meta) Encode() ([]byte, error) {
	if n := m.encodedLen(); n > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, n, MetaMaxSize)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidMeta, err)
	}
	code, _ := roleCode(m.Role)
	var flags byte
	if m.Leaving {
		flags |= flagLeaving
	}
	b := make([]byte, 0, m.encodedLen())
	b = append(b, metaVersion1, code, flags)
	for _, s := range []string{m.ClusterName, m.ID, m.AgentAddr, m.AdminAddr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b, nil
}

// DecodeMeta parses the output of Meta.Encode. Every error matches
// ErrInvalidMeta.
func DecodeMeta(b []byte) (Meta, error) {
	fail := func(format string, args ...any) (Meta, error) {
		return Meta{}, fmt.Errorf("%w: %s", ErrInvalidMeta, fmt.Sprintf(format, args...))
	}
	if len(b) == 0 {
		return fail("empty")
	}
	if len(b) > MetaMaxSize {
		return fail("%d bytes, limit %d", len(b), MetaMaxSize)
	}
	if b[0] != metaVersion1 {
		return fail("unknown encoding version %d", b[0])
	}
	if len(b) < 3 {
		return fail("truncated header")
	}
	var m Meta
	switch b[1] {
	case roleCodeCoordinator:
		m.Role = RoleCoordinator
	case roleCodeAgent:
		m.Role = RoleAgent
	default:
		return fail("unknown role code %d", b[1])
	}
	m.Leaving = b[2]&flagLeaving != 0
	rest := b[3:]
	names := [...]string{"cluster_name", "id", "agent_addr", "admin_addr"}
	fields := [...]*string{&m.ClusterName, &m.ID, &m.AgentAddr, &m.AdminAddr}
	for i, f := range fields {
		n, k := binary.Uvarint(rest)
		if k <= 0 {
			return fail("%s: bad length", names[i])
		}
		rest = rest[k:]
		if n > uint64(len(rest)) {
			return fail("%s: length %d beyond the end", names[i], n)
		}
		*f = string(rest[:n])
		rest = rest[n:]
	}
	if m.ClusterName == "" {
		return fail("no cluster_name")
	}
	if m.ID == "" {
		return fail("no id")
	}
	return m, nil
}
