package bus

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/planact/planact/pkg/fail"
)

// ReadObject reads object name of object store bucket without a consumer:
// its metadata, then its chunks one by one, each from the stream's leader
// (a follower may not hold an object just written). A consumer is what a
// reader would otherwise need, and the right to create one is the right to
// create any consumer on the stream, durable or pushing its messages to any
// subject: planact gives it to no trainer and not to the viewer.
//
// The data is checked against the digest the object's writer recorded; a
// store that is gone or an object that is not there (or deleted) is
// jetstream.ErrObjectNotFound. An object larger than limit bytes (when
// limit is not 0) is refused before it is read. The buffer is allocated
// once, at the object's size.
func ReadObject(ctx context.Context, nc *nats.Conn, bucket, name string, limit uint64) ([]byte, error) {
	stream := "OBJ_" + bucket
	// A store that is gone holds no object: said so, not a read to try
	// again (the stream's "not found" is no leader's passing absence).
	gone := func(err error) error {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("object %s/%s: the store is gone (%v): %w", bucket, name, err, jetstream.ErrObjectNotFound)
		}
		return err
	}
	meta, err := getMsg(ctx, nc, stream, map[string]any{"last_by_subj": fmt.Sprintf("$O.%s.M.%s", bucket, base64.URLEncoding.EncodeToString([]byte(name)))}, false)
	if err != nil {
		return nil, gone(err)
	}
	if meta == nil {
		return nil, fmt.Errorf("object %s/%s: %w", bucket, name, jetstream.ErrObjectNotFound)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(meta.Data, &info); err != nil {
		return nil, fail.Permanentf("object %s/%s: bad metadata: %v", bucket, name, err)
	}
	if info.Deleted {
		return nil, fmt.Errorf("object %s/%s: %w", bucket, name, jetstream.ErrObjectNotFound)
	}
	if limit > 0 && info.Size > limit {
		return nil, fail.Permanentf("object %s/%s: %d bytes: more than the %d it may take", bucket, name, info.Size, limit)
	}
	data := make([]byte, 0, info.Size)
	chunks := fmt.Sprintf("$O.%s.C.%s", bucket, info.NUID)
	seq := uint64(0)
	for i := uint32(0); i < info.Chunks; i++ {
		m, err := getMsg(ctx, nc, stream, map[string]any{"seq": seq + 1, "next_by_subj": chunks}, false)
		if err != nil {
			return nil, gone(err)
		}
		if m == nil {
			return nil, fail.Transientf("object %s/%s: chunk %d of %d is missing", bucket, name, i+1, info.Chunks)
		}
		if uint64(len(data)+len(m.Data)) > info.Size {
			return nil, fail.Permanentf("object %s/%s: more than the %d bytes its metadata says", bucket, name, info.Size)
		}
		data = append(data, m.Data...)
		seq = m.Seq
	}
	if uint64(len(data)) != info.Size {
		return nil, fail.Transientf("object %s/%s: read %d bytes, its metadata says %d", bucket, name, len(data), info.Size)
	}
	sum := sha256.Sum256(data)
	if want := "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:]); info.Digest != want {
		return nil, fail.Permanentf("object %s/%s: its data does not match its digest (%s, metadata %s)", bucket, name, want, info.Digest)
	}
	return data, nil
}

// SHA256 is the digest an arrival names its task list by: lower-case hex.
func SHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
