package waldenv1

import (
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// MarshalJSON encodes m as waldenctl -o json and the web view print it:
// proto JSON with the proto field names and every field present, each
// named value as its name in the field that has always carried it
// ("state": "alive", "kind": "dry_run", "role": "leader"). The enum fields
// are left out: scripts read exactly what they read before the enums. An
// enum field of a named value added since, with no string beside it
// (EventDetail.to_state, RestoreState.restore_phase), prints its name in
// its own field ("to_state": "failed"; "" for none). A message of another
// package is plain proto JSON with the same options.
func MarshalJSON(m proto.Message) ([]byte, error) {
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	if m.ProtoReflect().Descriptor().ParentFile().Package() != "walden.v1" {
		return opts.Marshal(m)
	}
	files, err := legacySchema()
	if err != nil {
		return nil, err
	}
	c := proto.Clone(m)
	ToLegacy(c)
	b, err := proto.Marshal(c)
	if err != nil {
		return nil, err
	}
	name := m.ProtoReflect().Descriptor().FullName()
	d, err := files.FindDescriptorByName(name)
	if err != nil {
		return nil, fmt.Errorf("waldenv1: json of %s: %w", name, err)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, fmt.Errorf("waldenv1: json of %s: not a message", name)
	}
	dm := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, dm); err != nil {
		return nil, err
	}
	fillNames(c.ProtoReflect(), dm)
	return opts.Marshal(dm)
}

// namedOffset moves a named enum field to another number in the JSON
// schema, where it is a string: the enum's varint, still on the wire under
// its own number, is then an unknown field the JSON leaves out.
const namedOffset = 100_000

// fillNames sets, in dst (m in the JSON schema), the name of each named
// enum field of src that the schema turned into a string, in m and in every
// message within it.
func fillNames(src, dst protoreflect.Message) {
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dfd := dst.Descriptor().Fields().ByName(fd.Name())
		switch {
		case dfd == nil:
		case fd.Enum() != nil && dfd.Kind() == protoreflect.StringKind && fd.IsList():
			l := dst.Mutable(dfd).List()
			for i := range v.List().Len() {
				l.Append(protoreflect.ValueOfString(nameOf(fd.Enum(), v.List().Get(i).Enum())))
			}
		case fd.Enum() != nil && dfd.Kind() == protoreflect.StringKind:
			dst.Set(dfd, protoreflect.ValueOfString(nameOf(fd.Enum(), v.Enum())))
		case fd.IsMap() && fd.MapValue().Message() != nil:
			dm := dst.Mutable(dfd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				fillNames(mv.Message(), dm.Mutable(k).Message())
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			dl := dst.Mutable(dfd).List()
			for i := range min(v.List().Len(), dl.Len()) {
				fillNames(v.List().Get(i).Message(), dl.Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			fillNames(v.Message(), dst.Mutable(dfd).Message())
		}
		return true
	})
}

// legacySchema is the walden.v1 package without the enum fields of
// legacyFields: the schema the deprecated strings belong to.
var legacySchema = sync.OnceValues(func() (*protoregistry.Files, error) {
	set := &descriptorpb.FileDescriptorSet{}
	protoregistry.GlobalFiles.RangeFilesByPackage("walden.v1", func(fd protoreflect.FileDescriptor) bool {
		fdp := protodesc.ToFileDescriptorProto(fd)
		for _, mp := range fdp.GetMessageType() {
			drop := map[string]bool{}
			for _, f := range legacyFields[protoreflect.FullName("walden.v1."+mp.GetName())] {
				drop[string(f.enum)] = true
			}
			kept := mp.Field[:0]
			for _, f := range mp.GetField() {
				if drop[f.GetName()] {
					continue
				}
				if ed, ok := namedEnum(f); ok && namesOf(ed) != nil {
					// A named value without a string beside it: its name,
					// in a string field of the same name (fillNames).
					f.Type, f.TypeName, f.Options = descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), nil, nil
					f.Number = proto.Int32(f.GetNumber() + namedOffset)
				}
				kept = append(kept, f)
			}
			mp.Field = kept
		}
		set.File = append(set.File, fdp)
		return true
	})
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("waldenv1: the schema without enum fields: %w", err)
	}
	return files, nil
})

// namedEnum returns the enum of field f when it is an enum of walden.v1.
func namedEnum(f *descriptorpb.FieldDescriptorProto) (protoreflect.EnumDescriptor, bool) {
	if f.GetType() != descriptorpb.FieldDescriptorProto_TYPE_ENUM {
		return nil, false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(strings.TrimPrefix(f.GetTypeName(), ".")))
	if err != nil {
		return nil, false
	}
	ed, ok := d.(protoreflect.EnumDescriptor)
	return ed, ok
}
