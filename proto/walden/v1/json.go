package waldenv1

import (
	"fmt"
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
// are left out: scripts read exactly what they read before the enums. A
// message of another package is plain proto JSON with the same options.
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
	return opts.Marshal(dm)
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
				if !drop[f.GetName()] {
					kept = append(kept, f)
				}
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
