"""slime rollouts from planact: point slime's --rollout-function-path here.

slime (THUDM/slime) calls its rollout function once per rollout step with
`generate_rollout(args, rollout_id, data_source, evaluation=False)` and
trains on the `list[list[Sample]]` it returns (the signature of
slime/rollout/sglang_rollout.py and of --rollout-function-path in
slime/utils/arguments.py, slime 624b824a, Aug 2026). With this module, the
planner's slime job and the actor's slime job each arrive for rollout N at
planact as their role, with their own SGLang router as the engine, and get
their samples back from planact, token-exact:

    PYTHONPATH=/path/to/planact/examples/python:$PYTHONPATH
    python train.py ... --rollout-function-path slime_planact.generate_rollout \\
        --custom-reward-post-process-path slime_planact.reward_post_process \\
        --eval-prompt-data nq /data/nq_eval.jsonl --eval-interval 20

(no --eval-function-path: slime then evaluates with this function, which
runs the eval prompts through planact; see evaluate()).

Ray starts slime's RolloutManager, where the function runs, in another
process: put PYTHONPATH and the PLANACT_* variables in the job's
runtime env (`ray job submit --runtime-env-json '{"env_vars": {...}}'`),
as slime's scripts do for their own variables.

Configuration, from the environment (a bad value is an error that names
the variable):

  PLANACT_ROLE            planner | actor. Required: the role this job
                          trains. The planner's job reads the batch from
                          slime's data source and sends it (the tasks) and
                          PLANACT_CONFIG; the actor's job sends neither
                          (planact takes the planner's) and leaves its data
                          source alone.
  PLANACT_NATS_URL        planact's NATS, default nats://127.0.0.1:4222;
                          several servers (a cluster) comma-separated, as
                          planact's NATS_URL.
  PLANACT_NATS_USER       with PLANACT_NATS_PASSWORD: the role's NATS user
  PLANACT_NATS_PASSWORD   (trainer-planner or trainer-actor in compose/).
  PLANACT_NATS_CREDS      or a .creds file (not both: an error).
  PLANACT_NATS_INBOX_PREFIX  where replies and deliveries to this job come:
                          default _INBOX_<PLANACT_NATS_USER> (planact's accounts
                          let each user read its own inboxes only), else
                          nats-py's _INBOX.
  PLANACT_CONFIG          the rollout's planact config, a JSON object
                          (schemas/defs.v1.schema.json#/$defs/config:
                          max_turns, tools, planner_sampling, actor_sampling,
                          reward, max_staleness, stream_groups, group_filter,
                          target_groups, ...). Give both jobs the same: the
                          planner's is sent, and with stream_groups,
                          group_filter or target_groups each job reads the
                          groups as planact delivers them. Training
                          samples with planner_sampling / actor_sampling,
                          not slime's --rollout-* flags; but slime's
                          trainer computes log-probs at
                          --rollout-temperature and over every token, so
                          the role's sampling temperature must be this
                          job's --rollout-temperature, and its top_p and
                          --rollout-top-p 1 (an error otherwise:
                          check_training_sampling). Evaluations take
                          slime's eval sampling, whose last fallbacks the
                          --rollout-* flags are.
  PLANACT_STALE           keep (default) | mask | drop: what to do with a
                          sample planact marked metadata.stale (its weights
                          more than max_staleness versions behind). keep:
                          train on it, metadata says stale; mask: keep it in
                          its group (for the group's baseline) with
                          remove_sample=True, so slime zeroes its loss mask;
                          drop: leave it out of the batch. Counted in the
                          metrics (planact/stale_samples, .../stale_dropped).
  PLANACT_TIMEOUT_S       how long to send the arrival (again, while no
                          stream takes it: planact not up yet) and wait for
                          planact's answer; default
                          the config's barrier_timeout_s + rollout_timeout_s
                          (planact's defaults 1800 + 3600) + 300 (for an
                          evaluation, its config's: PLANACT_EVAL_CONFIG's
                          time-outs count).
  PLANACT_ENGINE_URL      the engine URL planact's gateways call; default
                          slime's router, http://<args.sglang_router_ip>:
                          <args.sglang_router_port>.
  PLANACT_ROLLOUT_OFFSET  planact's rollout id is this + slime's rollout_id
                          (default 0). planact refuses a rollout id that
                          already ran (for as long as its history keeps it):
                          after a restart that reruns rollout ids, give both
                          jobs a new offset.
  PLANACT_EVAL_ROLLOUT_OFFSET  where the evaluations' planact rollout ids
                          start (default 1000000000): see eval_rollout_id.
                          A training rollout id at or past it is an
                          error.
  PLANACT_EVAL_CONFIG     a JSON object laid over each evaluation
                          rollout's config (PLANACT_CONFIG less
                          stream_groups, group_filter, target_groups and
                          result_samples; slime's eval sampling of its
                          datasets; evaluation on): it wins over slime's
                          eval sampling, for every dataset.

Decisions:
- planact's answer is the samples or an error: a timeout, a rejection or a
  failed rollout raises PlanactError (status and planact's reason), and so
  does a result with no samples. There is no fallback to slime's own
  rollout: it would train this role alone on single-turn samples while the
  other job waits, and the actor's job has no prompts of its own.
- Results "partial" (the rollout ran out of time) and "aborted" (cancelled)
  are trained on with the samples that finished, as docs/python_trainer.md
  says, with a warning giving planact's reason.
- A group with an aborted member (a task in state aborted, or a sample
  with status aborted: max_staleness ends an episode so) is left out of
  the batch whole, as slime trains on no ABORTED sample; with
  --partial-rollout it goes back to the data source, once (aborted_groups).
- rollout_log_probs are all the batch's samples' or none, as slime takes
  them from samples[0]: a sample without them makes every sample's None,
  or raises PlanactError under --use-tis, --use-rollout-logprobs or
  --get-mismatch-metrics (uniform_log_probs).
- Over-sampling follows slime's flags: the planner sends
  --over-sampling-batch-size groups (slime defaults it to
  --rollout-batch-size) and, when that is more than --rollout-batch-size,
  target_groups defaults to --rollout-batch-size: the rollout ends when that
  many groups are complete, like slime's own over-sampling. slime's
  --dynamic-sampling-filter-path cannot run inside planact: use
  group_filter ("spread" drops the groups whose rewards all equal, as
  slime's check_reward_nonzero_std; a URL asks your own filter). With
  --partial-rollout, the groups planact stopped before they finished go back
  to slime's data source (add_samples), as slime's rollout does with its
  aborted groups; they start again from their prompt.
- evaluation=True evaluates the Plan/Act system through planact (both
  roles, no training samples), each eval dataset with the sampling slime
  would evaluate it with (temperature, top_p, top_k, max_response_len,
  n_samples_per_eval_prompt: the dataset's or eval.defaults', else
  --eval-*, else --rollout-*, as slime resolves them; eval_datasets), each
  job for its own model, sent in its arrival (sampling).
  A planact rollout has one config: each dataset is a planact rollout of
  its own, all run at once (as slime's eval rollout runs its datasets),
  with ids from PLANACT_EVAL_ROLLOUT_OFFSET (default 10^9): datasets * (2
  * (PLANACT_ROLLOUT_OFFSET + rollout_id) + 1 after training rollout
  rollout_id) + the dataset's place (eval_rollout_id: slime's train.py
  evaluates at rollout_id 0 before and after training it); with one
  dataset, 10^9 + 2 * (...) (+ 1). It returns RolloutFnEvalOutput per eval
  dataset (evaluate()). Both jobs must run the same driver with
  --num-rollout (not --num-epoch) and the same eval datasets in the same
  order (--eval-prompt-data or --eval-config): both work the rollouts out
  from them. Each job's own flags decide its own model's sampling.
- Advantages: point both jobs' --custom-reward-post-process-path at
  slime_planact.reward_post_process. A group is the copies of one task, its
  members episodes (each counted once, whatever its number of samples),
  and every sample of an episode gets the episode's advantage (see its
  docstring and docs/python_trainer.md, "Group-relative advantages").
  Without the flag, slime would normalize by sample count, not by group:
  under a group-normalizing estimator that is an error
  (check_reward_post_process).
- Training steps: slime makes num_rollouts // --global-batch-size steps,
  counting rollouts by Sample.rollout_id, and leaves the rest out; the
  number of episodes that give a role samples varies, so the rollout ids
  are set to a whole number of steps and no sample is left out
  (fit_training_steps).
- The weight version the arrival announces is what the engine reports
  (SGLang's /get_weight_version on the router's workers), which slime sets
  on every weight update.

Samples: planact's sample fields are slime's (docs/python_trainer.md);
every sample becomes a slime Sample with the same tokens, response_length,
loss_mask, rollout_log_probs ([] for a response of no tokens), reward,
weight_versions, prompt, response, group_index and index, its status mapped (completed, truncated, aborted,
failed -> Sample.Status.COMPLETED, TRUNCATED, ABORTED, FAILED) and
planact's metadata added to it (planact's keys win; with planact_rollout_id
and planact_role).
A planner sample starts from the data source's Sample of its task (its
label, metadata and other fields kept). planact's rollout_id, shared by the
samples of one episode (the actor has one per act), becomes an int shared
the same way in Sample.rollout_id, which slime's loss uses to count one
episode once. The batch is one list per group_index, in group order.

Around weight updates, pause(role) and resume(role, weight_version) hold
the role's generations in planact while its engine's weights change (see
their docstrings and docs/python_trainer.md, "Training with slime").

Older slime: a Sample without rollout_id (before May 2026) gets none; a
Status without FAILED (before Dec 2025) gets ABORTED for failed samples;
without slime.rollout.base_types (before Oct 2025) the function returns
the list itself, as those versions expect. Only the current version's names
are checked by the tests.

Needs nats-py and msgpack, and trainer.py (next to this file), whose wire
helpers it uses.
"""

import asyncio
import copy
import dataclasses
import json
import logging
import math
import os
import secrets
import time
import urllib.request

import msgpack
import nats

import trainer
from slime.utils.types import Sample

try:
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
except ImportError:  # slime before Oct 2025 (#471) takes the list (the dict, evaluating) itself
    RolloutFnTrainOutput = RolloutFnEvalOutput = None

logger = logging.getLogger(__name__)

ROLES = ("planner", "actor")
STALE_POLICIES = ("keep", "mask", "drop")
CONTROL_STREAM = "CONTROL"
# planact's defaults (defs.v1.schema.json#/$defs/config), for the wait's bound.
DEFAULT_BARRIER_TIMEOUT_S = 1800
DEFAULT_ROLLOUT_TIMEOUT_S = 3600
DEFAULT_PAUSE_TIMEOUT_S = 600
# planact's sampling defaults (schema.DefaultConfig: planner_sampling and
# actor_sampling), which a role's training samples are drawn with unless the
# config says otherwise; slime's --rollout-temperature and --rollout-top-p
# default to the same.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
RESUME_WAIT_S = 120  # how long resume waits for planact's answer, as pkg/client's Resume
MAX_REASON = 1024  # the longest pause reason planact takes, in UTF-8 bytes (schema.MaxReason)
# Evaluations are planact rollouts from this on (eval_rollout_id): ids of
# their own, apart from the training rollouts' (a planact rollout id names
# one rollout).
DEFAULT_EVAL_ROLLOUT_OFFSET = 1_000_000_000
# What a training config may hold that an evaluation does not take.
TRAINING_ONLY = ("stream_groups", "group_filter", "target_groups", "result_samples")
# Each role's sampling: in an evaluation each job sends its own model's in its
# arrival (eval_role_sampling), and the config sent carries neither.
SAMPLING_KEYS = ("planner_sampling", "actor_sampling")

# slime's rollout ids this process generated a training rollout for: an
# evaluation at rollout_id r comes before training (slime's train.py at r
# 0, or --num-rollout 0) or after rollout r was generated (every
# --eval-interval), and the two need planact rollout ids of their own.
_generated = set()

# planact sample status -> slime Sample.Status member
STATUSES = {"completed": "COMPLETED", "truncated": "TRUNCATED", "aborted": "ABORTED", "failed": "FAILED"}
# planact's statuses of an evaluation's episodes that ended with a reward
# -> slime's, for its samples. Not here: unfinished, and aborted (an
# episode stopped before it ended, or ended by max_staleness): planact
# scored neither, and no reward of theirs is in a mean.
EPISODE_STATUSES = {"completed": "COMPLETED", "truncated": "TRUNCATED", "failed": "FAILED", "quarantined": "FAILED"}
# task states (rollout.result tasks) whose group is given back to slime's data
# source with --partial-rollout: stopped before they ended
STOPPED_STATES = ("aborted", "unfinished")


class PlanactError(RuntimeError):
    """planact did not give this role's samples: status is planact's
    (timeout, invalid, failed, ...) or the module's (unreachable: NATS,
    or planact's streams or buckets, not up in time, unsupported: a nats-server
    older than planact needs, empty, unreadable: a group or samples
    object planact named could not be read in time, miscounted: a group
    holds other than its sample_count,
    log_probs_missing: samples without rollout_log_probs where slime's args
    train with them)."""

    def __init__(self, status, reason):
        super().__init__(f"planact: {status}: {reason}")
        self.status, self.reason = status, reason


@dataclasses.dataclass(frozen=True)
class Settings:
    """The PLANACT_* configuration of a rollout job."""

    role: str
    connect: dict  # nats.connect() options
    config: dict
    stale: str
    timeout_s: float
    engine_url: str
    rollout_offset: int
    eval_config: dict = dataclasses.field(default_factory=dict)
    eval_rollout_offset: int = 0
    timeout_from_env: bool = False  # PLANACT_TIMEOUT_S given: else timeout_s is default_timeout(config)

    @property
    def streams_groups(self):
        """Whether planact delivers groups as they complete."""
        return delivers_groups(self.config)


def delivers_groups(config):
    """Whether a rollout of config delivers groups as they complete
    (stream_groups; a group filter or target_groups implies it)."""
    return bool(config.get("stream_groups") or config.get("target_groups") or config.get("group_filter") not in (None, "", "none"))


def connect_options(env=os.environ):
    """nats.connect() options from PLANACT_NATS_URL, _USER, _PASSWORD, _CREDS,
    _INBOX_PREFIX."""
    options = {"servers": trainer.server_list(env.get("PLANACT_NATS_URL") or "nats://127.0.0.1:4222", "PLANACT_NATS_URL")}
    user, password = env.get("PLANACT_NATS_USER", ""), env.get("PLANACT_NATS_PASSWORD", "")
    if bool(user) != bool(password):
        raise ValueError("PLANACT_NATS_USER and PLANACT_NATS_PASSWORD go together: set both or neither")
    if user and env.get("PLANACT_NATS_CREDS"):
        raise ValueError("PLANACT_NATS_USER/PLANACT_NATS_PASSWORD and PLANACT_NATS_CREDS are both set: "
                         "the job authenticates one way, a user and password or a .creds file; unset one")
    if user:
        options.update(user=user, password=password)
    if env.get("PLANACT_NATS_CREDS"):
        options["user_credentials"] = env["PLANACT_NATS_CREDS"]
    prefix = env.get("PLANACT_NATS_INBOX_PREFIX") or (trainer.inbox_prefix(user) if user else "")
    if prefix:
        if any(c in prefix for c in "*> \t") or prefix.endswith("."):
            raise ValueError(f"PLANACT_NATS_INBOX_PREFIX {prefix!r}: want subject tokens without wildcards or spaces, such as _INBOX_trainer-planner")
        options["inbox_prefix"] = prefix
    return options


def settings_from_env(env=os.environ):
    """The rollout job's Settings; a ValueError names the variable that is wrong."""
    role = env.get("PLANACT_ROLE", "")
    if role not in ROLES:
        raise ValueError(f"PLANACT_ROLE={role!r}: want planner or actor (the role this slime job trains)")
    config = parse_config(env.get("PLANACT_CONFIG", ""))
    stale = env.get("PLANACT_STALE") or "keep"
    if stale not in STALE_POLICIES:
        raise ValueError(f"PLANACT_STALE={stale!r}: want keep, mask or drop")
    if stale == "mask" and "remove_sample" not in Sample.__dataclass_fields__:
        raise ValueError("PLANACT_STALE=mask needs slime's Sample.remove_sample (slime since Nov 2025): use keep or drop")
    timeout_s = number_from_env(env, "PLANACT_TIMEOUT_S", default_timeout(config), positive=True)
    offset = number_from_env(env, "PLANACT_ROLLOUT_OFFSET", 0, integer=True)
    eval_config = parse_config(env.get("PLANACT_EVAL_CONFIG", ""), "PLANACT_EVAL_CONFIG")
    eval_offset = number_from_env(env, "PLANACT_EVAL_ROLLOUT_OFFSET", DEFAULT_EVAL_ROLLOUT_OFFSET, integer=True)
    return Settings(role=role, connect=connect_options(env), config=config, stale=stale, timeout_s=timeout_s,
                    engine_url=env.get("PLANACT_ENGINE_URL", ""), rollout_offset=offset,
                    eval_config=eval_config, eval_rollout_offset=eval_offset,
                    timeout_from_env=bool(env.get("PLANACT_TIMEOUT_S")))


def default_timeout(config):
    """PLANACT_TIMEOUT_S's default for a rollout of config: its
    barrier_timeout_s + rollout_timeout_s (planact's defaults where it sets
    none) + 300, past the time planact answers by."""
    return config.get("barrier_timeout_s", DEFAULT_BARRIER_TIMEOUT_S) + config.get(
        "rollout_timeout_s", DEFAULT_ROLLOUT_TIMEOUT_S) + 300


def number_from_env(env, name, default, positive=False, integer=False):
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: want {'an integer' if integer else 'a number'}") from None
    if (positive and value <= 0) or value < 0 or not math.isfinite(value):
        raise ValueError(f"{name}={text!r}: want a {'positive' if positive else 'non-negative'} number")
    return value


def parse_config(text, name="PLANACT_CONFIG"):
    """PLANACT_CONFIG (or name) as a dict. planact checks the whole config
    (and rejects the arrival saying what is wrong); here only what this
    module reads."""
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{name} must be a JSON object (planact's rollout config), not {type(config).__name__}")
    checks = {
        "target_groups": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "stream_groups": lambda v: isinstance(v, bool),
        "group_filter": lambda v: isinstance(v, str),
        "barrier_timeout_s": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 1 <= v <= 604800,
        "rollout_timeout_s": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 1 <= v <= 604800,
        # An evaluation sends neither in its config (eval_role_sampling reads
        # the job's own): planact would never see one that is not an object.
        "planner_sampling": lambda v: v is None or isinstance(v, dict),
        "actor_sampling": lambda v: v is None or isinstance(v, dict),
    }
    for key, ok in checks.items():
        if key in config and not ok(config[key]):
            raise ValueError(f"{name} {key}={config[key]!r} is not valid (see schemas/defs.v1.schema.json#/$defs/config)")
    return config


# The rollout function.


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """slime's rollout function: this role's samples of planact rollout
    PLANACT_ROLLOUT_OFFSET + rollout_id, grouped by group_index, with
    metrics (see the module's docstring)."""
    settings = settings_from_env()
    if evaluation:
        return evaluate(args, rollout_id, settings)
    n = settings.rollout_offset + rollout_id
    if n >= settings.eval_rollout_offset:
        raise ValueError(f"training rollout {n} (PLANACT_ROLLOUT_OFFSET={settings.rollout_offset} + slime's rollout_id {rollout_id}) "
                         f"is among the evaluations' planact rollout ids, from PLANACT_EVAL_ROLLOUT_OFFSET="
                         f"{settings.eval_rollout_offset} on: give the evaluations a larger offset")
    check_training_sampling(args, settings.config, settings.role)
    check_reward_post_process(args)
    _generated.add(rollout_id)
    engine = settings.engine_url or router_url(args)
    groups, config = [], None
    if settings.role == "planner":  # checked before the batch is taken from the data source
        count, config = batch_plan(args, settings.config)
        # The rollout runs with the config sent (batch_plan may add
        # target_groups, which streams the groups): wait and count with it.
        settings = dataclasses.replace(settings, config=config)
        groups = data_source.get_samples(count)
    fields = arrival_fields(n, settings.role, engine, engine_weight_version(engine), groups, config)
    logger.info("rollout %d: arriving as the %s with engine %s (weights %r), %d tasks; waiting up to %gs",
                n, settings.role, engine, fields["weight_version"], len(fields["tasks"] or []), settings.timeout_s)
    result, delivered = asyncio.run(run_rollout(settings, fields))
    samples = rollout_samples(result, delivered)
    aborted = aborted_groups(result, samples)
    kept = [s for s in samples if s.get("group_index", 0) not in aborted]
    batch, counts = slime_batch(kept, settings.role, settings.stale, originals_of(groups))
    counts["samples"], counts["aborted_samples"] = len(samples), len(samples) - len(kept)
    counts["aborted_groups"] = len({s.get("group_index", 0) for s in samples} & aborted)
    if counts["aborted_samples"]:
        logger.warning("rollout %d: %d %s samples of %d groups with an aborted episode left out of the batch "
                       "(slime trains on no aborted sample, and a group short of a copy has no fair baseline)",
                       n, counts["aborted_samples"], settings.role, counts["aborted_groups"])
    counts["groups_returned"] = 0
    if getattr(args, "partial_rollout", False) and groups:
        back = returned_groups(result, groups, aborted, {g[0].group_index for g in batch})
        if back:
            logger.info("rollout %d: %d groups stopped or aborted before they ended go back to the data source", n, len(back))
            data_source.add_samples(back)
            counts["groups_returned"] = len(back)
    metrics = rollout_metrics(result, delivered, counts, settings.streams_groups)
    if not batch:
        raise PlanactError("empty", f"rollout {n} gave the {settings.role} no samples to train on "
                                    f"(status {result['status']}; {result.get('reason') or 'no reason given'}; "
                                    f"tasks {task_states(result)}; stale dropped {counts['stale_dropped']}; "
                                    f"aborted left out {counts['aborted_samples']})")
    metrics.update(uniform_log_probs(batch, args, n, settings.role))
    metrics.update(fit_training_steps(batch, getattr(args, "global_batch_size", None), n, settings.role))
    if RolloutFnTrainOutput is None:
        return batch
    return RolloutFnTrainOutput(samples=batch, metrics=metrics)


# Evaluation through planact.

# slime's sampling of an eval dataset (slime/utils/eval_config.py,
# DATASET_RUNTIME_SPECS, and slime/rollout/sglang_rollout.py,
# eval_rollout_single_dataset; 624b824a): the dataset's own value, else
# eval.defaults' (--eval-config), else the first of these args that is set:
# the eval flag, then the training one. slime resolves args.eval_datasets
# so (build_eval_dataset_configs); the same chain fills what an entry
# leaves None, and makes the datasets of --eval-prompt-data where args have
# no eval_datasets (slime before Oct 2025, whose eval rollout took the same
# flags in the same order).
EVAL_SETTINGS = {
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
}


@dataclasses.dataclass(frozen=True)
class EvalDataset:
    """One of slime's eval datasets, as slime would evaluate it."""

    name: str
    path: str
    input_key: str
    label_key: object  # str, or None: no labels
    copies: int  # n_samples_per_eval_prompt: the copies of each prompt, one group
    sampling: dict  # planact's sampling fields for this job's role (eval_sampling)


def evaluate(args, rollout_id, settings):
    """slime's evaluation (generate_rollout with evaluation=True; slime calls
    the rollout function so when no --eval-function-path is given): the
    eval prompts run through planact, both roles, with config evaluation,
    so that no training sample is assembled.

    Each dataset is evaluated with slime's sampling for it (eval_datasets:
    temperature, top_p, top_k, max_response_len, n_samples_per_eval_prompt,
    with slime's fallbacks), each job's from its own args for its own
    model, sent in its arrival (eval_role_sampling). A planact
    rollout has one config, so each dataset is a planact rollout of its own
    (eval_rollouts), all run at once as slime's eval_rollout runs its
    datasets, with the ids of eval_rollout_id. Both jobs work the rollouts
    out from the eval datasets' names and order alone, so both need the
    same datasets; their sampling, which slime resolves in each job from
    its own flags (--rollout-* included), decides no id. The planner's job reads the datasets
    (eval_tasks) and sends each rollout its datasets' tasks and config
    (eval_config); the actor's job arrives for each with neither, and reads
    no file. Both get RolloutFnEvalOutput: data, one entry per dataset as
    slime's own eval rollout names them ({"rewards", "truncated",
    "samples"}, one per episode that ended with a reward; a Sample per
    episode with its answer as the response and no tokens; see
    eval_output), and metrics (planact_eval/...: accuracy, mean reward,
    turns and acts per episode, failures, per dataset and overall)."""
    rollouts = eval_arrivals(args, rollout_id, settings)
    results = asyncio.run(run_evaluations(rollouts))
    prompts = {}
    for r, result in zip(rollouts, results):
        n = r.fields["rollout"]
        prompts.update({(t["group_index"], t["index"]): t for t in r.fields["tasks"] or []})
        if not result.get("evaluation"):
            raise PlanactError("not_evaluation", f"rollout {n} ({settings.role}) is not an evaluation: the planner's config did not "
                                                 "ask for one (give both jobs the same slime_planact, called with evaluation=True)")
        others = sorted({o.get("dataset") or "" for o in result.get("episodes", [])} - set(r.datasets))
        if others:
            raise PlanactError("mismatch", f"evaluation {n} ({settings.role}) holds episodes of datasets {others}; this job "
                                           f"evaluates {', '.join(r.datasets)} there: give both jobs the same eval datasets in the "
                                           "same order (--eval-prompt-data or --eval-config), which decide the evaluation's rollouts")
    data, metrics = eval_output(results, settings.role, prompts, args)
    if RolloutFnEvalOutput is None:
        return data
    return RolloutFnEvalOutput(data=data, metrics=metrics)


@dataclasses.dataclass(frozen=True)
class EvalRollout:
    """One planact rollout of an evaluation: the arrival (trainer.arrive's
    fields), the names of its datasets, and the settings it waits with."""

    fields: dict
    datasets: list
    settings: Settings


def eval_arrivals(args, rollout_id, settings):
    """The planact rollouts of slime's evaluation at rollout_id, each an
    EvalRollout, in order (eval_rollouts): the planner's with its datasets'
    tasks and its config, the actor's with neither; each with its own
    model's sampling (eval_role_sampling)."""
    datasets = eval_datasets(args)
    parts = eval_rollouts(datasets)
    after = rollout_id in _generated
    engine = settings.engine_url or router_url(args)
    weight_version = engine_weight_version(engine)
    tasks = eval_tasks(args, datasets) if settings.role == "planner" else []
    # An evaluation rollout runs with the evaluation's config, whose time-outs
    # PLANACT_EVAL_CONFIG may set: the wait's default bound is of those
    # (the actor's job, which sends no config, works them out the same).
    timeout_s = settings.timeout_s if settings.timeout_from_env else default_timeout(eval_config(settings))
    out = []
    for part, names in enumerate(parts):
        n = eval_rollout_id(settings, rollout_id, after, part, len(parts))
        sampling = next(d.sampling for d in datasets if d.name == names[0])
        mine = [t for t in tasks if t["dataset"] in names]
        config = eval_config(settings) if settings.role == "planner" else None
        fields = {"rollout": n, "role": settings.role, "engine": {"url": engine, "protocol": "sglang"},
                  "weight_version": weight_version, "tasks": mine or None, "config": config,
                  "sampling": eval_role_sampling(settings, sampling)}
        logger.info("evaluation %d (slime rollout %d, %s, sampling %s): arriving as the %s with %d tasks",
                    n, rollout_id, ", ".join(names), sampling or "the config's", settings.role, len(mine))
        out.append(EvalRollout(fields=fields, datasets=names,
                               settings=dataclasses.replace(settings, config=config or {}, timeout_s=timeout_s)))
    return out


async def run_evaluations(rollouts):
    """run_rollout for each EvalRollout, at once (as slime's eval_rollout
    runs its datasets): their results, in order."""
    done = await asyncio.gather(*(run_rollout(r.settings, r.fields) for r in rollouts))
    return [result for result, _ in done]


def eval_rollout_id(settings, rollout_id, after=None, part=0, parts=1):
    """The planact rollout id of part (of parts, eval_rollouts: the eval
    datasets, in order) of slime's evaluation at rollout_id:
    PLANACT_EVAL_ROLLOUT_OFFSET + parts * (2 * (PLANACT_ROLLOUT_OFFSET +
    rollout_id) + after) + part, after 1 when the evaluation follows
    training rollout rollout_id (default: this process generated it).
    slime's train.py evaluates at rollout_id 0 before training and again
    after rollout 0 with --eval-interval 1; both jobs run the same driver
    with the same eval datasets, so both compute the same ids, and a
    restart with a new PLANACT_ROLLOUT_OFFSET gets new evaluation ids too.
    With one eval dataset (parts 1), the ids are
    PLANACT_EVAL_ROLLOUT_OFFSET + 2 * (...) + after."""
    if after is None:
        after = rollout_id in _generated
    if not 0 <= part < parts:
        raise ValueError(f"evaluation part {part} of {parts}")
    return settings.eval_rollout_offset + parts * (2 * (settings.rollout_offset + rollout_id) + int(after)) + part


def eval_datasets(args):
    """slime's eval datasets, each an EvalDataset with the sampling slime
    would evaluate it with: from args.eval_datasets (slime's
    EvalDatasetConfig, its fields resolved by slime: name, path, input_key,
    label_key, n_samples_per_eval_prompt, temperature, top_p, top_k,
    max_response_len) or else --eval-prompt-data name path [name path ...];
    a setting an entry leaves None is slime's fallback (EVAL_SETTINGS: the
    eval flag, then the training one). A setting planact cannot take
    raises ValueError naming the dataset (eval_sampling)."""
    entries = list(getattr(args, "eval_datasets", None) or [])
    if not entries:
        pairs = list(getattr(args, "eval_prompt_data", None) or [])
        if len(pairs) % 2:
            raise ValueError(f"--eval-prompt-data {pairs}: want name path pairs")
        entries = [{"name": name, "path": path} for name, path in zip(pairs[::2], pairs[1::2])]
    if not entries:
        raise ValueError("evaluation: slime's args name no eval dataset (--eval-prompt-data name path ..., or eval_datasets)")
    default_input = getattr(args, "eval_input_key", None) or getattr(args, "input_key", None) or "input"
    default_label = getattr(args, "eval_label_key", None) or getattr(args, "label_key", None)
    out = []
    for entry in entries:
        get = entry.get if isinstance(entry, dict) else (lambda k, e=entry: getattr(e, k, None))
        name = get("name")
        copies = eval_setting(args, get, "n_samples_per_eval_prompt")
        copies = 1 if copies is None else copies
        if not is_whole(copies) or copies < 1:
            raise ValueError(f"eval dataset {name}: n_samples_per_eval_prompt {copies!r} (the dataset's or eval.defaults', "
                             "else --n-samples-per-eval-prompt, else --n-samples-per-prompt): want a whole number, 1 or more")
        sampling = eval_sampling(name, *(eval_setting(args, get, k) for k in ("temperature", "top_p", "top_k", "max_response_len")))
        out.append(EvalDataset(name=name, path=get("path"), input_key=get("input_key") or default_input,
                               label_key=get("label_key") or default_label, copies=int(copies), sampling=sampling))
    names = [d.name for d in out]
    if len(set(names)) != len(names) or not all(isinstance(x, str) and x for x in names):
        raise ValueError(f"evaluation: eval dataset names {names}: want distinct, non-empty names")
    return out


def eval_setting(args, get, key):
    """slime's value of eval setting key for a dataset whose own is get(key):
    that, else the first of EVAL_SETTINGS[key]'s args that is set, else None."""
    value = get(key)
    for attr in EVAL_SETTINGS[key]:
        if value is not None:
            break
        value = getattr(args, attr, None)
    return value


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_whole(v):
    return is_number(v) and float(v).is_integer()


def eval_sampling(name, temperature, top_p, top_k, max_response_len):
    """planact's sampling fields, for this job's role, from slime's eval settings
    of dataset name (each None where neither the dataset nor slime's flags
    set it: the config's value stays). temperature, top_p and
    max_response_len (max_new_tokens) are planact's as they are. planact's
    sampling has no top_k: -1 (slime's default, every token) needs none,
    and 1 is greedy, as SGLang samples temperature 0, so temperature 0;
    another top_k raises ValueError, as does a value out of its range."""
    where = f"eval dataset {name}"
    sampling = {}
    if temperature is not None:
        if not is_number(temperature) or temperature < 0:
            raise ValueError(f"{where}: temperature {temperature!r} (the dataset's or eval.defaults', else "
                             "--eval-temperature, else --rollout-temperature): want a number, 0 or more")
        sampling["temperature"] = float(temperature)
    if top_p is not None:
        if not is_number(top_p) or not 0 < top_p <= 1:
            raise ValueError(f"{where}: top_p {top_p!r} (the dataset's or eval.defaults', else --eval-top-p, else "
                             "--rollout-top-p): "
                             "want more than 0, at most 1")
        sampling["top_p"] = float(top_p)
    if top_k is not None and not (is_whole(top_k) and top_k in (-1, 1)):
        raise ValueError(f"{where}: top_k {top_k!r} (the dataset's or eval.defaults', else --eval-top-k, else "
                         "--rollout-top-k): planact's sampling has no top_k; want -1 (all tokens, slime's default) or 1 (greedy), or use top_p")
    if top_k == 1:
        sampling["temperature"] = 0.0
    if max_response_len is not None:
        if not is_whole(max_response_len) or max_response_len < 1:
            raise ValueError(f"{where}: max_response_len {max_response_len!r} (the dataset's or "
                             "eval.defaults', else --eval-max-response-len, else --rollout-max-response-len): want a whole number, 1 or more")
        sampling["max_new_tokens"] = int(max_response_len)
    return sampling


def eval_rollouts(datasets):
    """The planact rollouts of an evaluation: the names of the datasets of
    each, one dataset each, in order. A rollout has one config; grouping
    the datasets that share their sampling would make the rollouts depend
    on each job's sampling, which slime resolves from that job's own flags
    (--rollout-*, which differ between the planner's and the actor's
    models): the jobs would arrive for different ids."""
    return [[d.name] for d in datasets]


def eval_tasks(args, datasets=None):
    """planact tasks from slime's eval datasets (JSON Lines; default
    eval_datasets(args)): one group per prompt, the dataset's
    n_samples_per_eval_prompt copies of it, numbered across the datasets in
    order, each naming its dataset. A dataset without prompts raises
    ValueError."""
    tasks = []
    for d in eval_datasets(args) if datasets is None else datasets:
        if not str(d.path).endswith(".jsonl"):
            raise ValueError(f"eval dataset {d.name}: {d.path}: slime_planact reads JSON Lines (.jsonl) eval data")
        with open(d.path, encoding="utf-8") as f:
            rows = [(i + 1, line) for i, line in enumerate(f) if line.strip()]
        if not rows:
            raise ValueError(f"eval dataset {d.name}: {d.path} holds no prompts")
        for line_no, line in rows:
            where = f"eval dataset {d.name} ({d.path}:{line_no})"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON: {e}") from None
            prompt = row.get(d.input_key) if isinstance(row, dict) else None
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{where}: no text under {d.input_key!r} (--input-key): planact's prompts are the question as text")
            group = (tasks[-1]["group_index"] + 1) if tasks else 0
            for _ in range(d.copies):
                task = {"group_index": group, "index": len(tasks), "prompt": prompt, "dataset": d.name}
                label = row.get(d.label_key) if d.label_key else None
                if label is not None and label != "":
                    task["label"] = label if isinstance(label, str) else json.dumps(label)
                tasks.append(task)
    return tasks


def eval_config(settings):
    """The config of an evaluation rollout, which the planner's job sends:
    PLANACT_CONFIG without what only training takes (TRAINING_ONLY:
    result_samples too, which planact refuses without groups) and without
    the roles' sampling (each job sends its own model's in its arrival:
    eval_role_sampling), PLANACT_EVAL_CONFIG over that, and evaluation on."""
    config = {k: v for k, v in settings.config.items() if k not in TRAINING_ONLY + SAMPLING_KEYS}
    for key, value in settings.eval_config.items():
        if key in SAMPLING_KEYS:
            continue
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    config["evaluation"] = True
    return config


def eval_role_sampling(settings, sampling):
    """This job's own model's sampling for an evaluation rollout, sent in
    its arrival (planact's arrival sampling: it becomes the rollout's
    <role>_sampling): PLANACT_CONFIG's <role>_sampling, slime's eval
    sampling of the rollout's datasets from this job's own flags over it
    (eval_sampling), PLANACT_EVAL_CONFIG's <role>_sampling over that."""
    key = f"{settings.role}_sampling"
    mine = settings.config.get(key)
    over = settings.eval_config.get(key)
    return {**(mine if isinstance(mine, dict) else {}), **sampling, **(over if isinstance(over, dict) else {})}


def eval_output(results, role, prompts, args=None):
    """slime's eval data and metrics from an evaluation's results (one per
    planact rollout). Only the episodes that ended with a reward
    (EPISODE_STATUSES) are in the data and the means. With slime's
    --log-passrate and --n-samples-per-eval-prompt above 1, slime reshapes
    a dataset's rewards into groups of that many (compute_pass_rate): a
    group whose episodes did not all end is left out whole, and counted
    (planact_eval/.../groups_dropped)."""
    episodes = [(r.get("rollout", 0), o) for r in results for o in r.get("episodes", [])]
    dropped = set()  # (dataset, group_index) left out whole
    if getattr(args, "log_passrate", False) and (getattr(args, "n_samples_per_eval_prompt", None) or 1) > 1:
        dropped = {(o.get("dataset") or "planact", o.get("group_index", 0)) for _, o in episodes
                   if o.get("status") not in EPISODE_STATUSES}
        if dropped:
            logger.warning("evaluation %s: %d groups of --n-samples-per-eval-prompt copies did not all end; left out "
                           "whole, for --log-passrate", [r.get("rollout") for r in results], len(dropped))
    data, counts = {}, {}
    for rollout, o in episodes:
        name = o.get("dataset") or "planact"
        c = counts.setdefault(name, {"episodes": 0, "ended": 0, "correct": 0, "turns": 0, "acts": 0, "reward": 0.0,
                                     "statuses": {}, "failures": {}})
        c["episodes"] += 1
        status = o.get("status")
        c["statuses"][status] = c["statuses"].get(status, 0) + 1
        if status not in EPISODE_STATUSES:  # did not end with a reward: in no mean
            continue
        if (name, o.get("group_index", 0)) in dropped:
            continue
        c["ended"] += 1
        c["correct"] += bool(o.get("correct"))
        c["turns"] += o.get("turns", 0)
        c["acts"] += o.get("acts", 0)
        c["reward"] += o.get("reward", 0.0)
        for kind, k in (o.get("failures") or {}).items():
            c["failures"][kind] = c["failures"].get(kind, 0) + k
        task = prompts.get((o.get("group_index", 0), o.get("index", 0)), {})
        sample = Sample(group_index=o.get("group_index", 0), index=o.get("index", 0), prompt=task.get("prompt", ""),
                        response=" | ".join(o.get("answers") or []), label=task.get("label"),
                        reward=float(o.get("reward", 0.0)), status=slime_status_of(EPISODE_STATUSES[status]))
        sample.metadata = {"planact_rollout_id": f"{rollout}-{o.get('episode', 0)}", "planact_role": role,
                           "dataset": name, "status": status, "reason": o.get("reason", ""), "turns": o.get("turns", 0),
                           "acts": o.get("acts", 0), "correct": bool(o.get("correct")), "failures": o.get("failures") or {}}
        d = data.setdefault(name, {"rewards": [], "truncated": [], "samples": []})
        d["rewards"].append(sample.reward)
        d["truncated"].append(status == "truncated")
        d["samples"].append(sample)
    metrics = {}
    total = {"episodes": 0, "ended": 0, "correct": 0, "turns": 0, "acts": 0, "reward": 0.0, "statuses": {}, "failures": {}}
    for name, c in counts.items():
        c["groups_dropped"] = len({gi for ds, gi in dropped if ds == name})
        metrics.update(eval_metrics(f"planact_eval/{name}/", c))
        for k in ("episodes", "ended", "correct", "turns", "acts", "reward", "groups_dropped"):
            total[k] = total.get(k, 0) + c[k]
        for k in ("statuses", "failures"):
            for kind, v in c[k].items():
                total[k][kind] = total[k].get(kind, 0) + v
    metrics.update(eval_metrics("planact_eval/", total))
    if not data:
        status = ", ".join(f"{r.get('rollout')}: {r.get('status')}; {r.get('reason') or 'no reason given'}" for r in results)
        raise PlanactError("empty", f"evaluation {', '.join(str(r.get('rollout')) for r in results)} ({role}): no episode "
                                    f"ended with a reward (status {status}; groups left out for --log-passrate: {len(dropped)})")
    return data, metrics


def eval_metrics(prefix, c):
    ended = c["ended"]
    m = {f"{prefix}episodes": c["episodes"], f"{prefix}ended": ended}
    if c.get("groups_dropped"):
        m[f"{prefix}groups_dropped"] = c["groups_dropped"]
    if ended:
        m.update({f"{prefix}accuracy": c["correct"] / ended, f"{prefix}mean_reward": c["reward"] / ended,
                  f"{prefix}mean_turns": c["turns"] / ended, f"{prefix}acts_per_episode": c["acts"] / ended})
    m.update({f"{prefix}episodes_{s}": k for s, k in c["statuses"].items()})
    m.update({f"{prefix}failures/{kind}": k for kind, k in c["failures"].items()})
    return m


def slime_status_of(name):
    if not hasattr(Sample.Status, name):  # FAILED: slime since Dec 2025
        name = "ABORTED"
    return Sample.Status[name]


def check_training_sampling(args, config, role):
    """Raises ValueError unless slime's trainer computes this role's
    log-probs as planact samples its training generations. slime's loss and
    its log-prob passes divide the logits by --rollout-temperature ("to
    match rollout-time log-probs": get_responses and
    get_log_probs_and_entropy in slime/backends/megatron_utils/loss.py), and with
    --rollout-top-p below 1 they need the nucleus the engine kept for each
    token (Sample.rollout_top_p_token_ids and _offsets, which
    RolloutManager._convert_samples_to_train_data asserts), which planact
    does not return. So the role's sampling in PLANACT_CONFIG
    (<role>_sampling: temperature, default 1; top_p, default 1) must have
    the temperature of slime's --rollout-temperature (default 1) and top_p
    1, as --rollout-top-p must be: else the trainer's log-probs, ratios and
    --use-tis corrections are of another distribution than the samples'
    (or slime stops after the rollout ran). Checked before anything is
    taken from the data source or sent."""
    sampling = config.get(f"{role}_sampling")
    sampling = sampling if isinstance(sampling, dict) else {}  # None: not set (parse_config refuses the rest)
    # What planact samples with: a field absent or null takes its default.
    temperature = DEFAULT_TEMPERATURE if sampling.get("temperature") is None else sampling["temperature"]
    top_p = DEFAULT_TOP_P if sampling.get("top_p") is None else sampling["top_p"]
    slime_temperature = getattr(args, "rollout_temperature", None)
    slime_temperature = 1.0 if slime_temperature is None else slime_temperature
    slime_top_p = getattr(args, "rollout_top_p", None)
    slime_top_p = 1.0 if slime_top_p is None else slime_top_p
    if slime_top_p != 1.0:
        raise ValueError(f"--rollout-top-p {slime_top_p}: slime then trains on the top-p nucleus the engine replays "
                         "(Sample.rollout_top_p_token_ids), which planact's samples do not have: leave --rollout-top-p at 1 "
                         "(evaluations take --eval-top-p)")
    if is_number(top_p) and top_p != 1.0:
        raise ValueError(f"PLANACT_CONFIG {role}_sampling.top_p {top_p}: the {role}'s training samples would come from the "
                         "top-p nucleus while slime's trainer computes their log-probs over every token (it replays no "
                         "nucleus planact could give): leave top_p at 1 for training (PLANACT_EVAL_CONFIG or --eval-top-p "
                         "set it for evaluations)")
    if is_number(temperature) and float(temperature) != float(slime_temperature):
        raise ValueError(f"PLANACT_CONFIG {role}_sampling.temperature {temperature:g} (planact's default 1) differs from "
                         f"--rollout-temperature {slime_temperature:g} (slime's default 1), at which slime's trainer "
                         f"computes the {role}'s log-probs: give this job --rollout-temperature {temperature:g}, or the "
                         f"config's {role}_sampling.temperature {slime_temperature:g}")


def check_reward_post_process(args):
    """Raises ValueError when slime would normalize this job's rewards by
    itself. Its own group normalization (RolloutManager._post_process_rewards,
    with no --custom-reward-post-process-path) reshapes the flattened batch
    into rows of --n-samples-per-prompt only when it holds exactly
    rollout_batch_size * n_samples_per_prompt samples, else normalizes the
    whole batch as one group: the actor's samples (one per act), and the
    planner's whenever a group is left out, dropped or over-sampled, would
    be compared with other tasks' episodes, each act counted as an episode.
    Checked before anything is taken from the data source or sent."""
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in GROUP_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        return
    if getattr(args, "custom_reward_post_process_path", None) or getattr(args, "custom_convert_samples_to_train_data_path", None):
        return
    raise ValueError(f"--advantage-estimator {estimator} normalizes rewards within groups, and without "
                     "--custom-reward-post-process-path slime does it by its sample count (rows of --n-samples-per-prompt "
                     "only when the batch holds exactly --rollout-batch-size x --n-samples-per-prompt samples, else the "
                     "whole batch as one group), not by planact's groups and episodes: give this job "
                     "--custom-reward-post-process-path slime_planact.reward_post_process "
                     "(or --disable-rewards-normalization)")


def batch_plan(args, config):
    """How many prompt groups the planner sends, and the config it sends:
    slime's over-sampling flags in planact's terms (see the docstring)."""
    if getattr(args, "dynamic_sampling_filter_path", None):
        raise ValueError("--dynamic-sampling-filter-path runs in slime's own rollout, not in planact's: "
                         'set group_filter in PLANACT_CONFIG instead ("spread" is check_reward_nonzero_std, '
                         "or the URL of your filter server)")
    batch_size = args.rollout_batch_size
    count = getattr(args, "over_sampling_batch_size", None) or batch_size
    target = config.get("target_groups", 0)
    if target > count:
        raise ValueError(f"PLANACT_CONFIG target_groups={target} is more than the {count} groups a rollout sends "
                         "(--over-sampling-batch-size, else --rollout-batch-size)")
    if count > batch_size and not target:
        config = {**config, "target_groups": batch_size}
    if delivers_groups(config) and "result_samples" not in config:
        # The groups' samples are read from the groups: the result need not
        # hold them again (nor planact read and write them again at the end).
        config = {**config, "result_samples": "undelivered"}
    return count, config


def router_url(args):
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise ValueError("slime's args have no sglang_router_ip/port to give planact as the engine: set PLANACT_ENGINE_URL")
    return f"http://{ip}:{port}"


def engine_weight_version(url, timeout_s=5.0):
    """The weight version the engine at url runs: SGLang's GET
    /get_weight_version on each worker the router lists (GET /workers, as
    slime's sglang_rollout.abort reads them), the newest; or the url's own
    when it is one server. "" (with a warning) when none answers: planact
    then knows only the versions the engine reports with each generation."""
    def get(u):
        with urllib.request.urlopen(u, timeout=timeout_s) as r:
            return json.load(r)

    try:
        urls = [w["url"] for w in get(f"{url}/workers")["workers"]]
    except (OSError, ValueError, KeyError, TypeError):
        urls = [url]
    versions = []
    for u in urls:
        try:
            versions.append(str(get(f"{u}/get_weight_version")["weight_version"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("no weight version from %s: %s", u, e)
    if not versions:
        logger.warning("the engine at %s reports no weight version: the arrival announces none", url)
        return ""
    return max(versions, key=version_number)


def version_number(version):
    """The number a weight version ends in, -1 if none (planact counts
    staleness in these: schema.VersionNumber)."""
    digits = len(version) - len(version.rstrip("0123456789"))
    return int(version[-digits:]) if digits else -1


def tasks_from_groups(groups):
    """planact tasks (schema defs task) from slime's prompt groups: one per
    Sample, with its group_index and index."""
    tasks, seen = [], set()
    for group in groups:
        for s in group:
            where = f"data source sample (group_index {s.group_index}, index {s.index})"
            if not isinstance(s.group_index, int) or not isinstance(s.index, int):
                raise ValueError(f"{where}: planact tasks need slime's group_index and index")
            if (s.group_index, s.index) in seen:
                raise ValueError(f"{where} comes twice in the batch")
            seen.add((s.group_index, s.index))
            if not isinstance(s.prompt, str) or not s.prompt:
                raise ValueError(f"{where}: the prompt must be non-empty text (planact writes the planner's prompt "
                                 "around it: give slime the question, without --apply-chat-template)")
            if any(v is not None for v in (getattr(s, "multimodal_inputs", None) or {}).values()):
                raise ValueError(f"{where} has multimodal inputs: planact rollouts are text only")
            task = {"group_index": s.group_index, "index": s.index, "prompt": s.prompt}
            if s.label is not None and s.label != "":
                # planact's labels are text (f1/em and reward servers read them)
                task["label"] = s.label if isinstance(s.label, str) else json.dumps(s.label)
            if s.metadata:
                try:
                    msgpack.packb(s.metadata)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"{where}: its metadata cannot go to planact: {e}") from None
                task["metadata"] = s.metadata
            tasks.append(task)
    return tasks


def arrival_fields(rollout, role, engine_url, weight_version, groups, config):
    """The arrival, as trainer.arrive / trainer.arrival_message take it: the
    planner brings the tasks and the config, the actor neither."""
    return {
        "rollout": rollout,
        "role": role,
        "engine": {"url": engine_url, "protocol": "sglang"},
        "weight_version": weight_version,
        "tasks": tasks_from_groups(groups) or None,
        "config": config or None,
    }


def originals_of(groups):
    """The data source's Samples by (group_index, index)."""
    return {(s.group_index, s.index): s for group in groups for s in group}


# Waiting for planact.


async def run_rollout(settings, fields):
    """Arrives and waits: returns the result and, when planact delivers
    groups, the groups delivered ({group_index: group message})."""
    n, role = fields["rollout"], fields["role"]
    nc = await connect(settings.connect)
    try:
        js = nc.jetstream()
        # One bound for both: sending the arrival until a stream takes it
        # (planact still starting), and waiting for the answer.
        deadline = time.monotonic() + settings.timeout_s
        try:
            arrival_id = await trainer.arrive(js, **fields, deadline=deadline)
        except trainer.NotUp as e:
            raise PlanactError("unreachable", f"rollout {n} ({role}): {e} (PLANACT_TIMEOUT_S={settings.timeout_s:g}s)") from None
        left = max(0.0, deadline - time.monotonic())
        try:
            if settings.streams_groups:
                result, delivered = await wait_groups(nc, js, n, role, arrival_id, left)
            else:
                result, delivered = await trainer.wait_result(nc, js, n, role, arrival_id, left), {}
        except nats.errors.TimeoutError:
            raise PlanactError("timeout", f"no {role} result for rollout {n} within PLANACT_TIMEOUT_S="
                                          f"{settings.timeout_s:g}s: is planact up, and did the other job arrive?") from None
        except trainer.Unreadable as e:
            raise PlanactError("unreadable", f"rollout {n} ({role}): {e} (PLANACT_TIMEOUT_S={settings.timeout_s:g}s)") from e
        except trainer.Miscounted as e:
            raise PlanactError("miscounted", f"rollout {n} ({role}): {e}") from e
    finally:
        await nc.close()
    check_status(result, n, role)
    return result, delivered


async def connect(options):
    try:
        nc = await nats.connect(**options)
    except Exception as e:  # nats-py raises several kinds; all mean the same here
        raise PlanactError("unreachable", f"cannot connect to planact's NATS at {options['servers']} "
                                          f"(PLANACT_NATS_URL): {e!r}") from e
    try:
        trainer.check_server(nc, ",".join(options["servers"]))
    except trainer.ServerTooOld as e:
        await nc.close()
        raise PlanactError("unsupported", str(e)) from None
    return nc


def check_status(result, n, role):
    """Raises unless the result has samples to train on (docs/python_trainer.md, 3)."""
    status, reason = result.get("status"), result.get("reason") or "no reason given"
    if status in ("partial", "aborted") and result.get("evaluation"):
        logger.warning("evaluation %d: %s: %s; the %s scores the episodes that ended", n, status, reason, role)
    elif status in ("partial", "aborted"):
        logger.warning("rollout %d: %s: %s; training the %s on the %d samples that finished",
                       n, status, reason, role, finished_samples(result))
    elif status != "ok":
        raise PlanactError(status, f"rollout {n} ({role}): {reason}")


def finished_samples(result):
    """How many samples the result gives: its own (sample_count) and, when
    it leaves the delivered groups out (result_samples undelivered), theirs
    (group_samples)."""
    count = result.get("sample_count", len(result["samples"]))
    if result.get("delivered_groups"):
        count += result.get("group_samples", 0)
    return count


async def wait_groups(nc, js, rollout, role, arrival_id, timeout_s):
    """This role's groups as planact delivers them, until its result (or the
    rejection of this arrival): returns (result, {group_index: group}).
    Subscribes to the groups and the result, and reads the last of each from
    the stream now and every few seconds (any group missed by then is read
    by its own subject: the last group message lists all delivered so far,
    the result every task); the wire protocol of schemas/README.md, 5."""
    base = f"rollout.{rollout}.result.{role}"
    result_subjects = [base, f"{base}.rejected"]
    arrived = asyncio.Queue()

    async def on_msg(msg):
        await arrived.put((msg.subject, msg.data))

    subs = [await nc.subscribe(s, cb=on_msg) for s in result_subjects + [f"{base}.group.*"]]
    delivered = {}

    async def take(data):
        """Keeps the group in data unless it was; returns the message."""
        group = decode_group(data, role)
        gi = group.get("group_index", 0)
        if gi not in delivered:
            if group.get("samples_object"):
                group["samples"] = await trainer.fetch_samples(nc, role, group["samples_object"], deadline)
            group.setdefault("samples", [])
            trainer.check_group_count(group)
            delivered[gi] = group
            logger.info("rollout %d: group %d delivered (%d of %s)", rollout, gi, len(delivered), group.get("groups", "?"))
        return group

    async def catch_up(named, delivered_for_sure=True):
        """Reads the groups named that were not taken yet. A group a message
        of planact's names delivered is there: read until the deadline
        (trainer.until_read). One that may not be (a trained task's group
        when the result holds every sample) is read once."""
        for gi in named:
            if gi in delivered:
                continue
            subject = f"{base}.group.{gi}"
            if delivered_for_sure:
                await take(await trainer.until_read(f"group {gi} of rollout {rollout}, named delivered ({subject})",
                                                    lambda: trainer.last_on(nc, subject), deadline))
            elif (data := await trainer.last_on(nc, subject)) is not None:
                await take(data)

    async def finish(data):
        # A result with every sample holds every delivered group's samples
        # again: its samples object (tens of megabytes at thousands of
        # episodes) is read only when a task outside the groups taken may
        # have samples in it (trained, or an episode that ended failed or
        # aborted). One that leaves the groups out (delivered_groups) holds
        # only what is needed, and the groups it names are read.
        result = await trainer.accept(nc, role, data, arrival_id, fetch=False, deadline=deadline)
        if result is not None:
            named = result.get("delivered_groups", [])
            await catch_up(named)
            trained = {t.get("group_index", 0) for t in result.get("tasks", []) if t["state"] == "trained"}
            await catch_up(sorted(trained - set(named)), delivered_for_sure=False)
            others = {t.get("group_index", 0) for t in result.get("tasks", []) if t["state"] in ("trained", "failed", "aborted")}
            if result.get("samples_object") and (named or others - set(delivered)):
                result["samples"] = await trainer.fetch_samples(nc, role, result["samples_object"], deadline)
                trainer.check_sample_count(result)
            if named:
                trainer.check_group_samples(result, sum(len(delivered[gi].get("samples", [])) for gi in named))
        return result

    deadline = time.monotonic() + timeout_s
    try:
        while True:
            last = await trainer.last_on(nc, f"{base}.group.*")
            if last is not None:
                await catch_up((await take(last)).get("delivered", []))
            for subject in result_subjects:
                result = await finish(await trainer.last_on(nc, subject))
                if result is not None:
                    return result, delivered
            while True:  # what the subscriptions bring, until the next read
                left = min(trainer.RECHECK_S, deadline - time.monotonic())
                if left <= 0:
                    break
                try:
                    subject, data = await asyncio.wait_for(arrived.get(), timeout=left)
                except asyncio.TimeoutError:
                    break
                if subject in result_subjects:
                    result = await finish(data)
                    if result is not None:
                        return result, delivered
                else:
                    await take(data)
            if time.monotonic() >= deadline:
                raise nats.errors.TimeoutError
    finally:
        for sub in subs:
            await sub.unsubscribe()


def decode_group(data, role):
    group = msgpack.unpackb(data, raw=False)
    if group.get("schema") != "rollout.group/1":
        raise ValueError(f"unexpected group schema {group.get('schema')!r}")
    if group.get("role") != role:
        raise ValueError(f"a group of the {group.get('role')!r} on the {role}'s subject")
    return group


# From planact's samples to slime's.


def rollout_samples(result, delivered):
    """This role's planact samples: the delivered groups' as they came, then
    the result's samples of the groups not delivered (a rollout that filters
    nothing has them: the finished copies of a group the rollout's end cut
    short). The result holds the delivered groups' samples again: not taken
    twice."""
    samples = [s for gi in sorted(delivered) for s in delivered[gi].get("samples", [])]
    samples += [s for s in result.get("samples", []) if s.get("group_index", 0) not in delivered]
    return samples


def slime_batch(samples, role, stale="keep", originals=None):
    """slime's list[list[Sample]]: one list per group_index, in group order,
    samples in index order (an episode's actor samples in the order they
    came). stale is the PLANACT_STALE policy. Returns (batch, counts)."""
    originals = originals or {}
    ordered = sorted(samples, key=lambda s: (s.get("group_index", 0), s.get("index", 0)))
    rollout_ids, groups = {}, {}
    counts = {"samples": len(samples), "stale_samples": 0, "stale_dropped": 0}
    for s in ordered:
        is_stale = bool(s.get("metadata", {}).get("stale"))
        counts["stale_samples"] += is_stale
        if is_stale and stale == "drop":
            counts["stale_dropped"] += 1
            continue
        key = (s.get("group_index", 0), s.get("index", 0))
        if role == "planner" and originals and key not in originals:
            raise ValueError(f"planact returned a planner sample for group {key[0]} index {key[1]}, a task this rollout did not send")
        sample = slime_sample(s, role, rollout_ids, originals.get(key))
        if is_stale and stale == "mask":
            sample.remove_sample = True  # slime zeroes its loss mask (RolloutManager._convert_samples_to_train_data)
        groups.setdefault(key[0], []).append(sample)
    if counts["stale_dropped"]:
        logger.warning("%d stale %s samples dropped (PLANACT_STALE=drop)", counts["stale_dropped"], role)
    return [groups[g] for g in sorted(groups)], counts


def slime_sample(s, role, rollout_ids, original=None):
    """One planact sample (schema defs sample) as a slime Sample, token-exact.
    rollout_ids maps planact's rollout ids (one per episode) to slime's ints."""
    gi, index = s.get("group_index", 0), s.get("index", 0)
    where = f"planact {role} sample {s.get('rollout_id')!r} (group {gi}, index {index})"
    tokens = list(s.get("tokens", []))
    n = s.get("response_length", 0)
    loss_mask = list(s.get("loss_mask", []))
    # Absent when an engine did not return them (metadata log_probs_missing
    # says why): never zeros. planact leaves an empty list out too: a
    # response of no tokens has all its log-probs, [].
    log_probs = [float(x) for x in s.get("rollout_log_probs") or []]
    if n > len(tokens):
        raise ValueError(f"{where}: response_length {n} is more than its {len(tokens)} tokens")
    if len(loss_mask) != n:
        raise ValueError(f"{where}: {len(loss_mask)} loss mask entries for {n} response tokens")
    if log_probs and len(log_probs) != n:
        raise ValueError(f"{where}: {len(log_probs)} log-probs for {n} response tokens")
    sample = copy.deepcopy(original) if original is not None else Sample()
    sample.group_index, sample.index = gi, index
    if "rollout_id" in Sample.__dataclass_fields__:  # slime since May 2026 (#1933)
        sample.rollout_id = rollout_ids.setdefault(s["rollout_id"], len(rollout_ids))
    sample.prompt = s.get("prompt", "")
    sample.tokens = tokens
    sample.response = s.get("response", "")
    sample.response_length = n
    sample.loss_mask = loss_mask
    # None: the engine gave none; settled for the whole batch by uniform_log_probs.
    sample.rollout_log_probs = log_probs if log_probs or n == 0 else None
    sample.reward = float(s.get("reward", 0.0))
    sample.status = slime_status(s.get("status"), where)
    sample.weight_versions = list(s.get("weight_versions", []))
    if original is None:  # a planner sample keeps its task's label as slime had it
        sample.label = s.get("label")
    sample.metadata = {**(sample.metadata or {}), **s.get("metadata", {}),
                       "planact_rollout_id": s["rollout_id"], "planact_role": role}
    return sample


def slime_status(status, where):
    name = STATUSES.get(status)
    if name is None:
        raise ValueError(f"{where}: status {status!r}: want one of {', '.join(STATUSES)}")
    if not hasattr(Sample.Status, name):  # FAILED: slime since Dec 2025 (#1219)
        name = "ABORTED"
    return Sample.Status[name]


# slime's flags that train with the engine's log-probs
# (slime/backends/megatron_utils/loss.py asserts or reads
# batch["rollout_log_probs"] under each).
LOG_PROB_FLAGS = ("use_tis", "use_rollout_logprobs", "get_mismatch_metrics")


def uniform_log_probs(batch, args, rollout=None, role=""):
    """Makes rollout_log_probs all or nothing across the batch, and returns
    metrics. slime decides for the whole batch from samples[0]
    (RolloutManager._convert_samples_to_train_data): a None among lists
    fails its tensors, and a first sample without them drops every
    sample's. A sample without them (the engine's reply had none:
    metadata log_probs_missing) raises PlanactError("log_probs_missing")
    when slime's args train with them (--use-tis, --use-rollout-logprobs,
    --get-mismatch-metrics); else every sample's are set to None (slime
    computes its own), with a warning."""
    samples = [s for group in batch for s in group]
    missing = [s for s in samples if s.rollout_log_probs is None]
    metrics = {"planact/log_probs_missing": len(missing), "planact/log_probs_dropped": 0}
    if not missing:
        return metrics
    first = missing[0]
    why = (first.metadata or {}).get("log_probs_missing") or "the engine returned none"
    flags = [f"--{f.replace('_', '-')}" for f in LOG_PROB_FLAGS if getattr(args, f, False)]
    if flags:
        raise PlanactError("log_probs_missing",
                           f"rollout {rollout}: {len(missing)} of {len(samples)} {role} samples have no rollout_log_probs "
                           f"(first: group {first.group_index}, index {first.index}: {why}), and {' '.join(flags)} "
                           "trains with them: find why the engine's replies lacked them (metadata log_probs_missing, "
                           f"docs/engines.md), or leave {' and '.join(flags)} off")
    dropped = len(samples) - len(missing)
    for s in samples:
        s.rollout_log_probs = None
    logger.warning("rollout %s: %d of %d %s samples have no rollout_log_probs (first: group %s, index %s: %s): slime takes "
                   "them for all samples or none, so the batch has none and slime computes its own", rollout,
                   len(missing), len(samples), role, first.group_index, first.index, why)
    metrics["planact/log_probs_dropped"] = dropped
    return metrics


# Group-relative advantages and training steps.

# slime's estimators that normalize rewards within a group
# (RolloutManager._post_process_rewards), and those that also divide by the
# group's standard deviation (with --grpo-std-normalization, slime's default).
GROUP_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_ESTIMATORS = ("grpo", "gspo", "cispo")


def reward_post_process(args, samples):
    """slime's --custom-reward-post-process-path for planact's samples, both
    roles: returns (raw_rewards, rewards), one of each per sample, as slime's
    RolloutManager._post_process_rewards does (slime calls it with the
    rollout's samples, flattened).

    A group is the copies of one task (group_index: n_samples_per_prompt
    episodes of one prompt), and its members are episodes, not samples:
    every sample of an episode (the planner's one, the actor's one per act)
    gets the episode's advantage, its outcome (the episode's reward) less
    the mean of the group's episode outcomes, each episode counted once
    however many samples it has; divided by their standard deviation (n-1,
    as torch.std) + 1e-6 under grpo, gspo and cispo with
    --grpo-std-normalization (slime's default). An episode alone in its
    group (the others gave this role no sample) has nothing to be compared
    with: advantage 0. Where all of a group's outcomes are equal, every
    advantage is 0; where they differ, they are not. Other estimators, or
    --disable-rewards-normalization, get the rewards as they are, as in
    slime. See docs/python_trainer.md, "Group-relative advantages".

    An actor sample whose reward is not its episode's outcome
    (metadata.episode_reward: split_act_reward is on) is refused: the
    groups compare outcomes, and a split reward would make long plans look
    worse for their length. A sample that is not planact's, or a reward
    that is not a number (--reward-key), is refused too."""
    raw = []
    for s in samples:
        meta = s.metadata or {}
        where = f"sample (group {s.group_index}, index {s.index})"
        if "planact_rollout_id" not in meta:
            raise ValueError(f"{where} has no metadata planact_rollout_id: slime_planact.reward_post_process "
                             "normalizes the rewards of planact's samples (slime_planact.generate_rollout)")
        r = s.reward
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise ValueError(f"{where}: reward {r!r} is not a number: planact's rewards are (leave --reward-key unset)")
        outcome = meta.get("episode_reward", r)
        if float(outcome) != float(r):
            raise ValueError(f"{where}: reward {r} is not its episode's outcome {outcome} (split_act_reward is on): "
                             "reward_post_process compares episode outcomes within a group; turn split_act_reward "
                             "off, or post-process the rewards yourself")
        raw.append(float(r))
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in GROUP_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    divide = estimator in STD_ESTIMATORS and getattr(args, "grpo_std_normalization", True)
    outcomes = {}  # group_index -> {episode: outcome}
    for s, r in zip(samples, raw):
        outcomes.setdefault(s.group_index, {})[s.metadata["planact_rollout_id"]] = r
    baselines = {gi: group_baseline(list(eps.values()), divide) for gi, eps in outcomes.items()}
    rewards = []
    for s, r in zip(samples, raw):
        mean, std = baselines[s.group_index]
        rewards.append((r - mean) / (std + 1e-6) if divide else r - mean)
    return raw, rewards


def group_baseline(values, with_std):
    """The mean of a group's episode outcomes and, with_std, their standard
    deviation (n-1, as torch.std; 0 for one episode, which has nothing to
    be compared with)."""
    mean = sum(values) / len(values)
    if not with_std or len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def fit_training_steps(batch, global_batch_size, rollout=None, role=""):
    """Sets Sample.rollout_id so that slime's training side takes every
    sample of the batch in whole training steps, and returns metrics.

    slime splits a rollout's samples into training steps by Sample.rollout_id
    (slime/utils/dp_schedule.py build_dp_schedule, called by
    RolloutManager._split_train_data_by_dp): num_rollouts // global_batch_size
    steps of global_batch_size rollouts, the trailing rollouts left out, and
    an assertion when there are fewer rollouts than that. One slime rollout
    is one planact episode here (its samples share the id, so that slime's
    loss counts an episode once however many acts it had, as slime does for
    subagent rollouts), but the number of episodes that give a role samples
    varies (an actor has none of an episode the planner answered at once).
    So the rollout ids are set to a whole number of steps,
    max(1, episodes // global_batch_size) of them:
      - more episodes than that: the extra ones share a rollout id with
        another episode of their group (its copy of the same task; of
        another group only when no group has two), which then counts as one
        rollout in slime's loss (their tokens' mean);
      - fewer (fewer episodes than one step): the episodes with the most
        samples give one sample each a rollout id of its own until there
        are global_batch_size; fewer samples than global_batch_size cannot
        make one step, and raise PlanactError("too_small").
    Nothing is left out; the metrics and a warning say what was shared or
    split. Advantages are the episodes' (reward_post_process), whatever the
    rollout ids. An older slime without Sample.rollout_id, or args without
    global_batch_size, leaves the batch as it is."""
    if "rollout_id" not in Sample.__dataclass_fields__ or not global_batch_size:
        return {}
    gbs = int(global_batch_size)
    slots, samples = [], 0  # each slot: one slime rollout, [(group_index, episode, [samples])]
    index = {}
    for group in batch:
        for s in group:
            episode = s.metadata["planact_rollout_id"]
            if episode not in index:
                index[episode] = len(slots)
                slots.append([(s.group_index, episode, [])])
            slots[index[episode]][0][2].append(s)
            samples += 1
    episodes = len(slots)
    if samples < gbs:
        raise PlanactError("too_small", f"rollout {rollout}: the {role} has {samples} samples from {episodes} episodes, "
                                        f"fewer than --global-batch-size {gbs} (slime's rollouts per training step): slime "
                                        f"could make no training step of them; lower the {role} job's --global-batch-size "
                                        "or send more tasks")
    want = gbs * max(1, episodes // gbs)
    size = lambda slot: sum(len(part[2]) for part in slot)
    while len(slots) > want:
        by_group = {}
        for i, slot in enumerate(slots):
            by_group.setdefault(slot[0][0], []).append(i)
        pool = max(by_group.values(), key=len)
        if len(pool) < 2:
            pool = range(len(slots))
        a, b = sorted(sorted(pool, key=lambda i: (size(slots[i]), -i))[:2])
        slots[a] = slots[a] + slots.pop(b)
    while len(slots) < want:
        i = max(range(len(slots)), key=lambda i: (size(slots[i]), -i))
        gi, episode, parts = max(slots[i], key=lambda part: len(part[2]))
        moved = parts.pop()
        slots.insert(i + 1, [(gi, episode, [moved])])
    for rid, slot in enumerate(slots):
        for _, _, parts in slot:
            for s in parts:
                s.rollout_id = rid
    shared = sum(len(slot) for slot in slots if len(slot) > 1)
    split = max(0, want - episodes)
    if shared or split:
        logger.warning("rollout %s: %d %s episodes in %d training steps of --global-batch-size %d: %s",
                       rollout, episodes, role, want // gbs, gbs,
                       f"{shared} of them share their rollout id with another episode" if shared
                       else f"{split} samples take a rollout id of their own (fewer episodes than one step)")
    return {"planact/train_rollouts": want, "planact/train_steps": want // gbs,
            "planact/episodes_sharing_rollout_id": shared, "planact/samples_split_off": split}


def task_states(result):
    """How the rollout's tasks ended: {state: count}."""
    states = {}
    for t in result.get("tasks", []):
        states[t["state"]] = states.get(t["state"], 0) + 1
    return states


def stopped_groups(result, groups):
    """The data source's groups none of whose tasks ended (aborted or
    unfinished: over-sampling stopped them, or the rollout's end)."""
    ended = {t.get("group_index", 0) for t in result.get("tasks", []) if t["state"] not in STOPPED_STATES}
    told = {t.get("group_index", 0) for t in result.get("tasks", [])}
    return [g for g in groups if g and g[0].group_index in told and g[0].group_index not in ended]


def aborted_groups(result, samples):
    """The group indexes with an aborted member: a task in state aborted
    (stopped, or its episode ended aborted: max_staleness) or a sample with
    status aborted. slime trains on no aborted sample (sglang_rollout gives
    them back to the data source), and the group's other copies, without
    it, are not the n_samples_per_prompt a group-relative baseline compares:
    none of the group is trained on."""
    out = {t.get("group_index", 0) for t in result.get("tasks", []) if t["state"] == "aborted"}
    return out | {s.get("group_index", 0) for s in samples if s.get("status") == "aborted"}


def returned_groups(result, groups, aborted, trained):
    """The data source's groups that go back to it with --partial-rollout:
    those stopped before they ended (stopped_groups) and those with an
    aborted member (aborted_groups), each once, and never one in the batch
    (trained)."""
    back = aborted | {g[0].group_index for g in stopped_groups(result, groups)}
    return [g for g in groups if g and g[0].group_index in back and g[0].group_index not in trained]


def rollout_metrics(result, delivered, counts, streamed):
    """slime logs these with its rollout metrics (RolloutFnTrainOutput.metrics)."""
    stats = result.get("stats", {})
    metrics = {f"planact/tasks_{state}": k for state, k in task_states(result).items()}
    metrics.update({
        "planact/samples": counts["samples"],
        "planact/stale_samples": counts["stale_samples"],
        "planact/stale_dropped": counts["stale_dropped"],
        "planact/aborted_groups_left_out": counts.get("aborted_groups", 0),
        "planact/aborted_samples_left_out": counts.get("aborted_samples", 0),
        "planact/groups_returned": counts.get("groups_returned", 0),
        "planact/accuracy": stats.get("accuracy", 0.0),
        "planact/mean_reward": stats.get("mean_reward", 0.0),
        "planact/mean_turns": stats.get("mean_turns", 0.0),
        "planact/acts": stats.get("acts", 0),
        "planact/wall_s": stats.get("wall_ms", 0) / 1000,
    })
    if streamed:
        metrics["planact/groups_delivered"] = len(delivered)
    return metrics


# Pause and resume around weight updates.


def pause(role, mode="wait", timeout_s=DEFAULT_PAUSE_TIMEOUT_S, reason="", wait_s=None):
    """Holds the role's generations in planact before its engine's weights
    change, and returns once none runs: planact's answer (control.paused/1:
    drained, missing, aborted). mode "wait" lets the running generations
    finish, "abort" aborts them (planact sends them again after the resume).
    Not resumed within timeout_s, planact fails the work waiting for the
    role. A mode, timeout_s or reason (over MAX_REASON bytes) planact would
    refuse raises ValueError before anything is sent; a pause planact
    refuses all the same (control.refused/1: a rule of a newer planact)
    raises PlanactError("refused", its reason). wait_s bounds the
    wait for the answer (default timeout_s + 30: planact answers by the
    pause's time-out at the latest). Connects with PLANACT_NATS_URL (and
    _USER, _PASSWORD, _CREDS)."""
    subject, headers, body = pause_message(role, mode, timeout_s, reason)
    wait_s = timeout_s + 30 if wait_s is None else wait_s
    return asyncio.run(run_pause(connect_options(), role, subject, headers, body, wait_s))


def resume(role, weight_version, wait_s=RESUME_WAIT_S):
    """Lets the role's generations go again, on the engine's new weights:
    weight_version is what the engine runs now (slime's updaters count
    versions "1", "2", ... from --update-weight-start-version), planact's
    newest for staleness. Returns planact's answer once it took the resume
    (control.resumed/1); one planact refuses raises PlanactError("refused",
    its reason). No answer within wait_s raises PlanactError("timeout"):
    the resume is stored all the same, and taken once planact runs."""
    subject, headers, body = resume_message(role, weight_version)
    return asyncio.run(run_control(connect_options(), role, "resume", subject, headers, body, wait_s))


def control_message(kind, role, verb, body, at_ms, nonce=None):
    """Subject, headers and msgpack body of a control message, as
    pkg/bus.NewMsg sends it (no rollout: no Planact-Rollout). Its
    Nats-Msg-Id is verb.role.at_ms.nonce (schema.Pause/Resume MsgID; a
    paused answer names it): the nonce, random unless given, tells it
    from another of the role in the same millisecond; a retry publishes
    these same headers, so JetStream drops its copy."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: want planner or actor")
    body = {"schema": kind, "role": role, **body, "at_ms": at_ms}
    headers = {
        "Planact-Schema": kind,
        "Planact-Role": role,
        "Content-Type": "application/msgpack",
        "Nats-Msg-Id": f"{verb}.{role}.{at_ms}.{nonce or secrets.token_hex(8)}",
    }
    return f"control.{role}.{verb}", headers, msgpack.packb(body, use_bin_type=True)


def pause_message(role, mode="wait", timeout_s=DEFAULT_PAUSE_TIMEOUT_S, reason="", at_ms=None):
    """control.pause/1 on control.<role>.pause."""
    if mode not in ("wait", "abort"):
        raise ValueError(f"pause mode {mode!r}: want wait or abort")
    if not 1 <= timeout_s <= 604800:
        raise ValueError(f"pause timeout_s {timeout_s}: want 1 to 604800 seconds (a week)")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"pause reason {reason!r}: want a string")
    if reason and len(reason.encode()) > MAX_REASON:
        raise ValueError(f"pause reason {reason[:32]!r}… ({len(reason.encode())} bytes): want at most {MAX_REASON} bytes "
                         "(planact repeats it when the pause expires)")
    body = {"mode": mode, "timeout_s": timeout_s}
    if reason:
        body["reason"] = reason
    return control_message("control.pause/1", role, "pause", body, at_ms or int(time.time() * 1000))


def resume_message(role, weight_version, at_ms=None):
    """control.resume/1 on control.<role>.resume."""
    body = {"weight_version": str(weight_version)} if weight_version not in (None, "") else {}
    return control_message("control.resume/1", role, "resume", body, at_ms or int(time.time() * 1000))


async def run_pause(options, role, subject, headers, body, wait_s):
    """Publishes the pause and waits for the answer that names it (see
    run_control); warns when gateways did not say they stopped in time."""
    answer = await run_control(options, role, "pause", subject, headers, body, wait_s)
    if answer.get("missing"):
        logger.warning("pause %s: gateways %s did not say they stopped in time",
                       headers["Nats-Msg-Id"], ", ".join(answer["missing"]))
    return answer


async def run_control(options, role, verb, subject, headers, body, wait_s):
    """Publishes a pause or resume (verb) and waits for planact's answer
    that names it by its Nats-Msg-Id: control.<role>.paused (pause_id) or
    control.<role>.resumed (resume_id), or its refusal on
    control.<role>.refused (id and verb), which raises
    PlanactError("refused"). Found by subscription or, every few seconds,
    by a direct get on the CONTROL stream, as pkg/client does."""
    msg_id = headers["Nats-Msg-Id"]
    answer_subject, id_field = {"pause": (f"control.{role}.paused", "pause_id"),
                                "resume": (f"control.{role}.resumed", "resume_id")}[verb]
    refused_subject = f"control.{role}.refused"
    nc = await connect(options)
    answers = asyncio.Queue()

    async def on_msg(msg):
        await answers.put((msg.subject, msg.data))

    def answered(subject, data):
        if not data:
            return None
        answer = msgpack.unpackb(data, raw=False)
        if subject == refused_subject:
            if answer.get("id") == msg_id and answer.get("verb") == verb:
                raise PlanactError("refused", f"{verb} {msg_id}: {answer.get('reason', '')}")
            return None
        return answer if answer.get(id_field) == msg_id else None

    try:
        subs = [await nc.subscribe(s, cb=on_msg) for s in (answer_subject, refused_subject)]
        try:
            deadline = time.monotonic() + wait_s
            try:
                await trainer.publish_until_up(nc.jetstream(), subject, body, headers, deadline)
            except trainer.NotUp as e:
                raise PlanactError("unreachable", f"{verb} {msg_id}: {e} (within {wait_s:g}s)") from None
            while True:
                answer = None
                for s in (refused_subject, answer_subject):
                    answer = answer or answered(s, await trainer.last_on(nc, s, stream=CONTROL_STREAM))
                while answer is None:
                    left = min(trainer.RECHECK_S, deadline - time.monotonic())
                    if left <= 0:
                        break
                    try:
                        answer = answered(*await asyncio.wait_for(answers.get(), timeout=left))
                    except asyncio.TimeoutError:
                        break
                if answer is not None:
                    return answer
                if time.monotonic() >= deadline:
                    raise PlanactError("timeout", f"no answer to {verb} {msg_id} on {answer_subject} within {wait_s:g}s")
        finally:
            for sub in subs:
                await sub.unsubscribe()
    finally:
        await nc.close()
