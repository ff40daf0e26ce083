package actdispatcher

import "github.com/planact/planact/pkg/session"

// errRolloutOver is the cause of an act's context when its rollout ended
// (cancelled, timed out, enough groups) while the act ran.
var errRolloutOver = session.ErrRolloutOver
