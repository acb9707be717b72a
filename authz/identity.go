package authz

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"strings"

	"walden/config"
)

// Role is what an identity may do. Each certificate carries exactly one.
type Role string

// The roles, from the most to the least privileged person, then the
// processes.
const (
	// RoleAdmin may do what an operator does and change the membership of
	// the coordinator group (member add, remove) and of the broker registry
	// (remove a registration).
	RoleAdmin Role = "admin"
	// RoleOperator may do what a reader does, and fail brokers over, ack
	// them, set maintenance, cancel and retry jobs, set the policy and
	// transfer the leadership.
	RoleOperator Role = "operator"
	// RoleReader reads the cluster's state.
	RoleReader Role = "reader"
	// RoleCoordinator is a coordinator member: it alone speaks raft and
	// forwards calls to the leader.
	RoleCoordinator Role = "coordinator"
	// RoleAgent registers its broker and renews its lease; bound to one
	// broker id.
	RoleAgent Role = "agent"
	// RoleBroker is an agent that also opens, commits to and closes its own
	// streams in the catalog and reads the catalog; bound to one broker id.
	RoleBroker Role = "broker"
)

// Roles lists every role.
var Roles = []Role{RoleAdmin, RoleOperator, RoleReader, RoleCoordinator, RoleAgent, RoleBroker}

// Errors of identities.
var (
	// ErrUnknownRole means a role name is not one of Roles.
	ErrUnknownRole = errors.New("authz: unknown role")
	// ErrNoIdentity means a certificate carries no walden identity, or an
	// ambiguous or malformed one (matched by *IdentityError).
	ErrNoIdentity = errors.New("authz: no walden identity")
)

// IdentityError says why a certificate carries no usable identity.
type IdentityError struct {
	// Name is the certificate's common name.
	Name string
	// Reason says what is wrong, for people.
	Reason string
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("authz: certificate %q carries no walden identity: %s", e.Name, e.Reason)
}

// Is makes errors.Is(err, ErrNoIdentity) true.
func (e *IdentityError) Is(target error) bool { return target == ErrNoIdentity }

// RoleError names a role that is not one of Roles.
type RoleError struct{ Role string }

func (e *RoleError) Error() string {
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return fmt.Sprintf("unknown role %q (roles: %s)", e.Role, strings.Join(names, ", "))
}

// Is makes errors.Is(err, ErrUnknownRole) true.
func (e *RoleError) Is(target error) bool { return target == ErrUnknownRole }

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", &RoleError{Role: s}
}

// BrokerBound reports whether identities of the role act for one broker id.
func (r Role) BrokerBound() bool { return r == RoleAgent || r == RoleBroker }

// Identity is who is calling: the name and role of a certificate, the
// broker id of an agent or broker, and the coordinator that forwarded the
// call, if any.
type Identity struct {
	// Name is the certificate's common name ("alice", "c1", "b1").
	Name string
	// Role is the certificate's role; empty for Anonymous.
	Role Role
	// BrokerID is the broker an agent or broker identity acts for.
	BrokerID string
	// Via is the coordinator that forwarded the call ("" when direct).
	Via string
}

// Anonymous is the identity of every caller when TLS is off: no
// certificate, no authorization.
var Anonymous = Identity{Name: "anonymous"}

// IsAnonymous reports whether id is the identity of a plaintext caller.
func (id Identity) IsAnonymous() bool { return id.Role == "" }

// String names the identity for people: "alice" (operator),
// "b1" (agent of broker b1), "alice" (reader, forwarded by c2).
func (id Identity) String() string {
	if id.IsAnonymous() {
		return "anonymous (no TLS)"
	}
	what := string(id.Role)
	if id.Role.BrokerBound() {
		what += " of broker " + id.BrokerID
	}
	if id.Via != "" {
		what += ", forwarded by " + id.Via
	}
	return fmt.Sprintf("%q (%s)", id.Name, what)
}

// Validate reports why id is not a usable identity: a valid name, a known
// role, and a broker id exactly when the role is bound to one.
func (id Identity) Validate() error {
	if err := config.CheckName(id.Name); err != nil {
		return fmt.Errorf("name: %w", err)
	}
	if _, err := ParseRole(string(id.Role)); err != nil {
		return err
	}
	switch {
	case id.Role.BrokerBound() && id.BrokerID == "":
		return fmt.Errorf("role %s needs a broker id", id.Role)
	case id.Role.BrokerBound():
		if err := config.CheckName(id.BrokerID); err != nil {
			return fmt.Errorf("broker id: %w", err)
		}
	case id.BrokerID != "":
		return fmt.Errorf("role %s takes no broker id (only agent and broker do)", id.Role)
	}
	return nil
}

// How an identity is written in a certificate's subject, as Kubernetes
// takes a user from the common name and its groups from the organization:
//
//	CN=<name>, O=walden:<role>[, OU=walden:broker-id:<id>]
//
// The prefixes keep a certificate of a CA shared with other uses (whose
// O names a company) from being read as a walden role by accident.
const (
	rolePrefix   = "walden:"
	brokerPrefix = "walden:broker-id:"
)

// Subject is the certificate subject that carries id.
func Subject(id Identity) pkix.Name {
	n := pkix.Name{CommonName: id.Name, Organization: []string{rolePrefix + string(id.Role)}}
	if id.BrokerID != "" {
		n.OrganizationalUnit = []string{brokerPrefix + id.BrokerID}
	}
	return n
}

// FromCertificate reads the identity a certificate carries. A certificate
// with no walden role, two roles, an unknown role, or a broker id that does
// not fit its role carries none (ErrNoIdentity): it is allowed nothing.
func FromCertificate(c *x509.Certificate) (Identity, error) {
	id := Identity{Name: c.Subject.CommonName}
	var roles, brokers []string
	for _, o := range c.Subject.Organization {
		if strings.HasPrefix(o, rolePrefix) {
			roles = append(roles, strings.TrimPrefix(o, rolePrefix))
		}
	}
	for _, ou := range c.Subject.OrganizationalUnit {
		if strings.HasPrefix(ou, brokerPrefix) {
			brokers = append(brokers, strings.TrimPrefix(ou, brokerPrefix))
		}
	}
	switch len(roles) {
	case 0:
		return id, &IdentityError{Name: id.Name, Reason: fmt.Sprintf("it has no organization %q<role>", rolePrefix)}
	case 1:
		id.Role = Role(roles[0])
	default:
		return id, &IdentityError{Name: id.Name, Reason: fmt.Sprintf("it has %d roles (%s); it must have one", len(roles), strings.Join(roles, ", "))}
	}
	if len(brokers) > 1 {
		return id, &IdentityError{Name: id.Name, Reason: fmt.Sprintf("it names %d broker ids; it may name one", len(brokers))}
	}
	if len(brokers) == 1 {
		id.BrokerID = brokers[0]
	}
	if err := id.Validate(); err != nil {
		return Identity{Name: id.Name}, &IdentityError{Name: id.Name, Reason: err.Error()}
	}
	return id, nil
}
