package sim

import "fmt"

// Special token ids of the simulated tokenizer. Every other id is a byte
// plus ByteOffset, so tokenization is exact and reversible.
const (
	PadID      = 0
	BOSID      = 1
	EOSID      = 2
	ByteOffset = 3
	VocabSize  = 256 + ByteOffset
)

// Encode turns text into token ids, one per byte.
func Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = int(text[i]) + ByteOffset
	}
	return ids
}

// Decode turns token ids back into text, skipping special tokens.
func Decode(ids []int) (string, error) {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		switch {
		case id < 0 || id >= VocabSize:
			return "", fmt.Errorf("token id %d out of vocabulary [0,%d)", id, VocabSize)
		case id < ByteOffset:
			continue
		default:
			b = append(b, byte(id-ByteOffset))
		}
	}
	return string(b), nil
}

// tokenText is how a single token is shown in OpenAI log-probs.
func tokenText(id int) string {
	switch id {
	case PadID:
		return "<pad>"
	case BOSID:
		return "<s>"
	case EOSID:
		return "</s>"
	}
	return string([]byte{byte(id - ByteOffset)})
}
