package waldenv1

import (
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Named is an enum of types.proto: a value with a name people read.
type Named interface {
	BrokerState | ObservationState | JobState | JobStep | MemberRole | EventKind | RestorePhase
	Descriptor() protoreflect.EnumDescriptor
	Number() protoreflect.EnumNumber
	Name() string
}

// Name is the broker state's name in the API, the CLI, metrics and logs
// ("alive"); "" for BROKER_STATE_UNSPECIFIED.
func (x BrokerState) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the observation's name ("alive", "suspect", "dead"); "" for
// OBSERVATION_STATE_UNSPECIFIED.
func (x ObservationState) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the job state's name ("pending", "running", ...); "" for
// JOB_STATE_UNSPECIFIED.
func (x JobState) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the step's name ("fence", "attach", ...); "" for
// JOB_STEP_UNSPECIFIED.
func (x JobStep) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the role's name ("voter", "learner", "leader", "follower"); ""
// for MEMBER_ROLE_UNSPECIFIED.
func (x MemberRole) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the event kind's name ("register", "dry_run", ...); "" for
// EVENT_KIND_UNSPECIFIED.
func (x EventKind) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Name is the restore phase's name ("scan", "survey", "plan", "recover",
// "done"); "" for RESTORE_PHASE_UNSPECIFIED (not restored).
func (x RestorePhase) Name() string { return nameOf(x.Descriptor(), x.Number()) }

// Parse returns the value of E named s (as Name spells it), and false when
// no value is (the empty name included).
func Parse[E Named](s string) (E, bool) {
	var zero E
	n, ok := namesOf(zero.Descriptor()).byName[s]
	return E(n), ok
}

// Values returns every value of E but the unspecified one, in number order.
func Values[E Named]() []E {
	var zero E
	nums := namesOf(zero.Descriptor()).numbers
	out := make([]E, len(nums))
	for i, n := range nums {
		out[i] = E(n)
	}
	return out
}

// Names returns the names of Values[E](), in the same order.
func Names[E Named]() []string {
	var zero E
	return append([]string(nil), namesOf(zero.Descriptor()).names...)
}

// enumNames are the names of one enum's values.
type enumNames struct {
	byNumber map[protoreflect.EnumNumber]string
	byName   map[string]protoreflect.EnumNumber
	numbers  []protoreflect.EnumNumber // but 0, in number order
	names    []string                  // the names of numbers
}

// allNames maps each enum of types.proto to the names of its values: the
// value's identifier without the prefix its UNSPECIFIED value has, in
// lower case. Built on first use (the file's descriptor is initialized
// after this package's variables).
var allNames = sync.OnceValue(func() map[protoreflect.FullName]*enumNames {
	out := map[protoreflect.FullName]*enumNames{}
	eds := File_walden_v1_types_proto.Enums()
	for i := range eds.Len() {
		ed := eds.Get(i)
		prefix := strings.TrimSuffix(string(ed.Values().ByNumber(0).Name()), "UNSPECIFIED")
		n := &enumNames{byNumber: map[protoreflect.EnumNumber]string{}, byName: map[string]protoreflect.EnumNumber{}}
		for j := range ed.Values().Len() {
			v := ed.Values().Get(j)
			if v.Number() == 0 {
				continue
			}
			name := strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix))
			n.byNumber[v.Number()] = name
			n.byName[name] = v.Number()
			n.numbers = append(n.numbers, v.Number())
			n.names = append(n.names, name)
		}
		out[ed.FullName()] = n
	}
	return out
})

func namesOf(ed protoreflect.EnumDescriptor) *enumNames { return allNames()[ed.FullName()] }

// nameOf is the name of value n of enum ed: "" for 0, the number itself
// for a value this version does not know (sent by a newer walden).
func nameOf(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	if n == 0 {
		return ""
	}
	if s, ok := namesOf(ed).byNumber[n]; ok {
		return s
	}
	return strconv.Itoa(int(n))
}
