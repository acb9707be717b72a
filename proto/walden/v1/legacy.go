package waldenv1

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The enums of types.proto replaced string fields. The strings stay in the
// messages, deprecated, because an older walden wrote them: raft entries,
// snapshots and backups hold them, and an older walden (a member during a
// rolling upgrade, a client) reads and sends them. This file is the one
// place that converts between the two.

// legacyField is a deprecated string field and the enum field that
// replaced it, in one message.
type legacyField struct {
	enum, str protoreflect.Name
}

// legacyFields lists, by message, every deprecated string field and its
// enum field (TestLegacyFieldsComplete checks it against the .proto files).
var legacyFields = map[protoreflect.FullName][]legacyField{
	"walden.v1.Observation":     {{"observation_state", "state"}},
	"walden.v1.Broker":          {{"broker_state", "state"}},
	"walden.v1.Event":           {{"event_kind", "kind"}},
	"walden.v1.ObserveBroker":   {{"observation_state", "state"}},
	"walden.v1.Checkpoint":      {{"job_step", "step"}},
	"walden.v1.Job":             {{"job_state", "state"}, {"job_step", "step"}},
	"walden.v1.CheckpointJob":   {{"job_step", "step"}},
	"walden.v1.FinishJob":       {{"job_state", "state"}},
	"walden.v1.ListJobsRequest": {{"job_state", "state"}},
	"walden.v1.Member":          {{"member_role", "role"}},
	"walden.v1.Failover":        {{"job_state", "state"}, {"job_step", "step"}},
}

// LegacyNameError is a deprecated string that names no value of its enum.
type LegacyNameError struct {
	// Field is the string field's name ("state"), Value its value.
	Field, Value string
	// Names are the names of the enum's values.
	Names []string
}

func (e *LegacyNameError) Error() string {
	return fmt.Sprintf("%s %q is not %s", e.Field, e.Value, oneOf(e.Names))
}

// UpgradeLegacy rewrites m, and every message within it, into this
// version's form: each deprecated string that names a value sets the enum
// field that replaced it (unless the enum is already set: a writer that
// set both meant the enum) and is cleared. A string that names no value is
// left in place, and the first such is returned (a *LegacyNameError); the
// rest of m is upgraded all the same.
func UpgradeLegacy(m proto.Message) error {
	var first error
	walkLegacy(m.ProtoReflect(), func(msg protoreflect.Message, enum, str protoreflect.FieldDescriptor) {
		s := msg.Get(str).String()
		if s == "" {
			return
		}
		if msg.Get(enum).Enum() == 0 {
			n, ok := namesOf(enum.Enum()).byName[s]
			if !ok {
				if first == nil {
					first = &LegacyNameError{Field: string(str.Name()), Value: s, Names: namesOf(enum.Enum()).names}
				}
				return
			}
			msg.Set(enum, protoreflect.ValueOfEnum(n))
		}
		msg.Clear(str)
	})
	return first
}

// HasLegacy reports whether m, or a message within it, carries a
// deprecated string (what an older walden wrote).
func HasLegacy(m proto.Message) bool {
	found := false
	walkLegacy(m.ProtoReflect(), func(msg protoreflect.Message, _, str protoreflect.FieldDescriptor) {
		found = found || msg.Has(str)
	})
	return found
}

// oneOf spells names as "a, b or c".
func oneOf(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// AddLegacy sets every deprecated string field in m, and in every message
// within it, to the name of its enum field's value, keeping the enums: the
// form both this version and an older one read. A string whose enum is
// unspecified is left as it is.
func AddLegacy(m proto.Message) {
	walkLegacy(m.ProtoReflect(), setLegacy)
}

// ToLegacy is AddLegacy that then clears the enum fields: m as a walden
// before the enums would have written it.
func ToLegacy(m proto.Message) {
	walkLegacy(m.ProtoReflect(), func(msg protoreflect.Message, enum, str protoreflect.FieldDescriptor) {
		setLegacy(msg, enum, str)
		msg.Clear(enum)
	})
}

func setLegacy(msg protoreflect.Message, enum, str protoreflect.FieldDescriptor) {
	if v := msg.Get(enum).Enum(); v != 0 {
		msg.Set(str, protoreflect.ValueOfString(nameOf(enum.Enum(), v)))
	}
}

// walkLegacy calls fn for every pair of legacyFields in m and in every
// message within it (set fields, lists and map values), parents first.
func walkLegacy(m protoreflect.Message, fn func(msg protoreflect.Message, enum, str protoreflect.FieldDescriptor)) {
	if !m.IsValid() {
		return
	}
	md := m.Descriptor()
	for _, f := range legacyFields[md.FullName()] {
		if e, s := md.Fields().ByName(f.enum), md.Fields().ByName(f.str); e != nil && s != nil {
			fn(m, e, s)
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := range l.Len() {
				walkLegacy(l.Get(i).Message(), fn)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				walkLegacy(mv.Message(), fn)
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			walkLegacy(v.Message(), fn)
		}
		return true
	})
}
