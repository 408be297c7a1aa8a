"""The train step's contract: one trace for all loops, the strategy that `scaling` asks for."""

import numpy as np
import pytest
import tensorflow as tf

from detsweep.config import ScalingConfig, load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import evaluation_dataset, training_dataset
from detsweep.data.processing import InputSpec, raw_predictions
from detsweep.models import build_model
from detsweep.optim import MovingAverage, build_optimizer
from detsweep.train import strategy as strategy_module
from detsweep.train.checkpoint import TrainingState
from detsweep.train.evaluate import Evaluator
from detsweep.train.step import make_train_loop

from .conftest import REPO


def test_no_retracing_between_loops_after_evaluation_or_for_a_shorter_last_loop():
    config = load_trial_config(REPO / "configs" / "quickstart.yaml",
                               ["data.train.num_images=16", "data.val.num_images=8"])
    strategy = strategy_module.make_strategy(config.scaling, [])
    assert strategy is tf.distribute.get_strategy()  # one CPU worker: no all-reduce, no device copies
    train_set = load_dataset(config.data.train, verify=False)
    val_set = load_dataset(config.data.val, verify=False)
    spec = InputSpec(config.model.image_size)
    with strategy.scope():
        model, losses = build_model(config.model, 3)
        optimizer = build_optimizer(config.optimizer)
        optimizer.build(model.trainable_variables)
        average = MovingAverage.of_model(model, 0.99, dynamic=True)
        state = TrainingState(model, optimizer, average)
    batches = iter(strategy.distribute_datasets_from_function(
        lambda context: training_dataset(train_set, spec, config.data.augmentation, batch_size=4, seed=0)))
    loop = make_train_loop(strategy, model, losses, optimizer, average, state.step)
    evaluator = Evaluator(model, val_set, spec, batch_size=8)
    for _ in range(2):
        result = loop(batches, tf.constant(2))
        evaluator.evaluate_with_average(average, int(state.step.numpy()))
    loop(batches, tf.constant(1))
    assert int(state.step.numpy()) == 5 and int(result["steps_run"]) == 2
    assert loop.experimental_get_tracing_count() == 1
    assert evaluator.step.experimental_get_tracing_count() == 1


XLA_SCRIPT = r"""
config = load_trial_config(sys.argv[1], ["data.train.num_images=16", "optimizer.learning_rate.warmup_steps=0"])
train_set = load_dataset(config.data.train, verify=False)
batch = next(iter(training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation, 8, seed=0)))
found = {}
for jit_compile in (False, True):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(1)
    with strategy.scope():
        state, losses = build_training_state(config, 3)
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat()))
    loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step,
                           jit_compile=jit_compile)
    library = loop.get_concrete_function(batches, tf.constant(1)).graph.as_graph_def().library.function
    found[str(jit_compile)] = {"losses": [float(loop(batches, tf.constant(1))["loss"]) for _ in range(4)],
                               "compiled": [f.signature.name for f in library if f.attr["_XlaMustCompile"].b]}
results["xla"] = found
"""


def test_xla_compiles_each_replicas_forward_and_backward_pass_and_two_logical_devices_train_as_without_it(
        two_devices):
    """``train.jit_compile`` on two logical CPU devices standing in for two GPUs, each with 4
    images of the global 8: each replica's forward and backward pass is one XLA function (the
    loop's graph says so), and from the same weights and images four steps with and without it
    give the same losses within float rounding in XLA's fused order, grown by training."""
    found = two_devices["xla"]
    plain, xla = found["False"], found["True"]
    assert xla["compiled"] and not plain["compiled"], found
    # the first two steps' losses within 1e-4 (3e-5 measured); rounding grows step by step after
    # (quickstart's rate 0.04 with momentum), 8e-3 measured at the fourth
    assert xla["losses"][:2] == pytest.approx(plain["losses"][:2], rel=1e-4), found
    assert xla["losses"] == pytest.approx(plain["losses"], rel=5e-2), found
    assert plain["losses"][-1] < plain["losses"][0] / 2  # it trains: the comparison is over steps that move


def test_each_worker_plans_its_strategy_over_every_device_of_a_given_device_list():
    """No GPU here: the device lists are given, as TensorFlow would list them on a GPU node
    (Ray makes each worker see only its own GPUs), and the plan is inspected, not built."""
    from detsweep.train.strategy import Kind, StrategyPlan, plan_strategy

    gpus = ["/device:GPU:0", "/device:GPU:1"]
    two_by_two = ScalingConfig(num_workers=2, use_gpu=True, gpus_per_worker=2)
    assert plan_strategy(two_by_two, gpus) == StrategyPlan(Kind.MULTI_WORKER, tuple(gpus), "NCCL")
    assert plan_strategy(ScalingConfig(num_workers=2), []) == StrategyPlan(Kind.MULTI_WORKER, (), "RING")
    one_by_two = ScalingConfig(use_gpu=True, gpus_per_worker=2)
    assert plan_strategy(one_by_two, gpus) == StrategyPlan(Kind.MIRRORED, tuple(gpus), "NCCL")
    assert plan_strategy(ScalingConfig(use_gpu=True), gpus[:1]) == StrategyPlan(Kind.ONE_GPU, ("/device:GPU:0",))
    assert plan_strategy(ScalingConfig(), []) == StrategyPlan(Kind.DEFAULT)
    assert plan_strategy(ScalingConfig(use_tpu=True), []).kind is Kind.TPU
    # a CPU trial on a GPU node trains on its CPU: the GPUs it sees are another trial's
    assert plan_strategy(ScalingConfig(), gpus) == StrategyPlan(Kind.DEFAULT)
    assert plan_strategy(ScalingConfig(num_workers=2), gpus) == StrategyPlan(Kind.MULTI_WORKER, (), "RING")
    assert (two_by_two.replicas, one_by_two.replicas, ScalingConfig(use_gpu=True, gpus_per_worker=0.5).replicas) == (4, 2, 1)


TWO_DEVICES_SCRIPT = r"""
from detsweep.config import ScalingConfig
from detsweep.train.strategy import DevicesNotAsSized, make_strategy

two = ["/device:CPU:0", "/device:CPU:1"]  # two logical CPU devices stand in for a worker's two GPUs
found = {"built": {}}
for name, scaling, devices in [("two of two", ScalingConfig(use_gpu=True, gpus_per_worker=2), two),
                               ("one of two", ScalingConfig(use_gpu=True, gpus_per_worker=2), two[:1]),
                               ("two of one", ScalingConfig(use_gpu=True, gpus_per_worker=1), two),
                               ("cpu trial", ScalingConfig(), two)]:
    try:
        strategy = make_strategy(scaling, devices)
        on = strategy.extended.worker_devices if strategy.num_replicas_in_sync > 1 else ()
        found["built"][name] = [type(strategy).__name__, strategy.num_replicas_in_sync, [d.rsplit("/", 1)[1] for d in on]]
    except DevicesNotAsSized as error:
        found["built"][name] = str(error)

# the step traced on the two-device strategy, every replica context's all-reduce spied on
config = load_trial_config(sys.argv[1])
strategy = make_strategy(ScalingConfig(use_gpu=True, gpus_per_worker=2), two)
sizes = []  # how many tensors each replica's all-reduce carries
all_reduce = tf.distribute.ReplicaContext.all_reduce


def counted(self, reduce_op, value, options=None):
    sizes.append(len(tf.nest.flatten(value)))
    return all_reduce(self, reduce_op, value, options)


tf.distribute.ReplicaContext.all_reduce = counted  # Keras's calls included
with strategy.scope():
    state, losses = build_training_state(config, 3)
train_set = load_dataset(config.data.train, verify=False)
batch = next(iter(training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation, 8, seed=0)))
batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat()))
loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step)
loop.get_concrete_function(batches, tf.constant(1))  # traced, not run: NCCL has no CPU kernel
tf.distribute.ReplicaContext.all_reduce = all_reduce
found["traced"] = {"replicas": strategy.num_replicas_in_sync, "variables": len(state.model.trainable_variables),
                   "sizes": sizes}
results.update(found)
"""


def test_make_strategy_builds_the_planned_strategy_and_refuses_fewer_or_more_replicas_than_sized(two_devices):
    """The real strategies over given devices: a worker sized for two GPUs that can use one, or
    sized for one and handed two, fails at its start with one line naming the node, what
    TensorFlow listed and what was expected; a CPU trial trains on the CPU whatever it is handed."""
    import socket

    built, host = two_devices["built"], socket.gethostname()
    assert built["two of two"] == ["MirroredStrategy", 2, ["device:CPU:0", "device:CPU:1"]], built
    assert built["one of two"] == (f"scaling: found 1 replica(s) in step on {host} (TensorFlow lists /device:CPU:0), "
                                   "expected 2: 1 worker(s) x 2 GPU(s) each, as train.batch_size was split for")
    assert built["two of one"].startswith(f"scaling: found 2 replica(s) in step on {host} (TensorFlow lists "
                                          "/device:CPU:0, /device:CPU:1), expected 1: "), built
    assert built["cpu trial"] == ["_DefaultDistributionStrategy", 1, []], built


def test_each_step_all_reduces_its_gradients_twice_spied_on_two_logical_devices(two_devices):
    """``make_strategy``'s MirroredStrategy on two logical devices: as the step is traced, each
    replica all-reduces the positive anchors' count (one scalar) once and the gradients (one
    tensor per trainable variable) twice: once in the step, so that clipping and the loss scale
    see the global gradient, and once more in Keras's optimizer, which needs a replica context
    to apply them (Keras 3.15: from the cross-replica context, where it would not all-reduce,
    its update fails under every strategy that uses merge_call, and its LossScaleOptimizer
    refuses to run). The spy counts calls to TensorFlow's public ``ReplicaContext.all_reduce``
    and passes each on."""
    traced = two_devices["traced"]
    replicas, variables = traced["replicas"], traced["variables"]
    gradients = [size for size in traced["sizes"] if size > 1]
    assert replicas == 2 and gradients == [variables] * 2 * replicas, traced  # twice per replica
    assert sorted(traced["sizes"]) == sorted([1] * replicas + gradients), traced  # and the positives' count


def test_use_tpu_builds_a_tpu_strategy_mocked_tpu_resolver(monkeypatch):
    """No TPU exists here: the resolver, cluster connection and TPUStrategy are mocks."""
    calls = []

    class FakeResolver:
        pass

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", FakeResolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r)))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("init", r)))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: ("TPUStrategy", r))
    kind, resolver = strategy_module.make_strategy(ScalingConfig(use_tpu=True), [])
    assert kind == "TPUStrategy" and isinstance(resolver, FakeResolver)
    assert [name for name, _ in calls] == ["connect", "init"]


SHARDED_EVALUATION_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.processing import InputSpec
from detsweep.train.checkpoint import build_training_state
from detsweep.train.evaluate import Evaluator

config = load_trial_config(sys.argv[1], ["data.val.num_images=7", "model.class_prediction_bias_init=0.0"])
val_set = load_dataset(config.data.val, verify=False)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(1)
with strategy.scope():
    state, losses = build_training_state(config, 3)
spec = InputSpec.of(config.model)
found = {}
for name, on in (("one device", None), ("two devices", strategy)):
    evaluator = Evaluator(state.model, val_set, spec, 2, losses=losses, strategy=on)
    detections, loss = evaluator.detect_all()
    found[name] = {"detections": sorted((d["image_id"], d["category_id"], d["score"], *d["bbox"]) for d in detections),
                   "loss": loss, "line": evaluator.sharing_line,
                   "metrics": evaluator.evaluate_with_average(state.moving_average, 0).metrics}
print(json.dumps(found))
"""


def test_an_evaluation_sharded_over_two_devices_scores_as_one_device():
    """Two logical CPU devices stand in for two GPUs: 7 val images at 2 a device a step are one
    step of 4 and one of 3 and a filler; each device detects on its half, the detections are
    gathered, and every image's detections, the loss and the metrics are one device's. (Two
    workers, each a pipeline with its share: the two-worker training in ``test_train.py``.)"""
    from .conftest import run_on_two_cpu_devices

    found = run_on_two_cpu_devices(SHARDED_EVALUATION_SCRIPT, str(REPO / "configs" / "quickstart.yaml"), timeout=300)
    one, two = found["one device"], found["two devices"]
    assert len(one["detections"]) > 7 and {row[0] for row in one["detections"]} == set(range(1, 8))
    assert len(two["detections"]) == len(one["detections"])
    assert np.allclose(np.array(two["detections"]), np.array(one["detections"]), atol=1e-3)
    # one pipeline deals its batches of 2 to the devices in turn: one device's batches
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-4) and one["loss"]["loss"] > 0
    assert two["metrics"] == pytest.approx(one["metrics"], abs=1e-6)
    assert one["line"].endswith("7 val images evaluated by 1 pipeline, 2 a device a step")


def test_the_val_sets_loss_is_the_training_loss_of_its_images_and_the_filler_copies_weigh_nothing():
    """10 val images in batches of 8: the second batch is 2 images and 6 filler copies. The
    evaluator's loss must be the training loss of the first 8 and of the last 2, each batch
    normalised by its own positives, weighed 8 : 2."""
    config = load_trial_config(REPO / "configs" / "quickstart.yaml", ["data.val.num_images=10"])
    val_set = load_dataset(config.data.val, verify=False)
    spec = InputSpec(config.model.image_size)
    model, losses = build_model(config.model, 3)
    evaluator = Evaluator(model, val_set, spec, batch_size=8, losses=losses)
    _, found = evaluator.detect_all()
    images, meta = next(iter(evaluation_dataset(val_set, spec, batch_size=10)))  # all 10, no filler
    predictions = raw_predictions(model, images)
    expected = {}
    for part, weight in ((slice(0, 8), 0.8), (slice(8, 10), 0.2)):
        terms = losses(images[part], {k: meta[k][part] for k in ("boxes", "labels")},
                       {k: v[part] for k, v in predictions.items()})
        for name, value in (("box_loss", terms["box"]), ("classification_loss", terms["classification"])):
            expected[name] = expected.get(name, 0.0) + weight * float(value)
    assert not model.losses  # no weight decay in the quickstart: the loss is the two terms
    expected["loss"] = expected["box_loss"] + expected["classification_loss"]
    assert found == pytest.approx(expected, rel=1e-4)


REPLICA_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import training_dataset
from detsweep.data.processing import InputSpec
from detsweep.train.checkpoint import build_training_state
from detsweep.train.step import make_train_loop

# Only the order of the sums may differ: TensorFlow's multi-threaded kernels otherwise
# reorder them from run to run, by up to 1e-2 in the gradients of the batch norms' offsets.
tf.random.set_seed(0)
tf.config.experimental.enable_op_determinism()


def one_step(config, batch, devices):
    strategy = tf.distribute.MirroredStrategy(devices)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        state, losses = build_training_state(config, 3)
    before = [w.numpy().copy() for w in state.model.trainable_weights]
    batches = iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat()))
    loop = make_train_loop(strategy, state.model, losses, state.optimizer, state.moving_average, state.step)
    result = loop(batches, tf.constant(1))
    return {
        "loss": [float(result["loss"])],
        "weights": [w.numpy() for w in state.model.trainable_weights],
        "statistics": [w.numpy() for w in state.model.non_trainable_weights],
        "optimizer": [v.numpy() for v in state.optimizer.variables],
        "average": [v.numpy() for v in state.moving_average.averages],
        "update": [np.concatenate([(w.numpy() - b).ravel() for w, b in zip(state.model.trainable_weights, before)])],
    }


clip = float(sys.argv[2])
config = load_trial_config(sys.argv[1], ["model.use_sync_bn=true", "optimizer.learning_rate.warmup_steps=0",
                                         f"train.gradient_clipping_by_norm={clip}"])
train_set = load_dataset(config.data.train, verify=False)
# 8 different images: one device takes all 8, each of two replicas 4 of them
batch = next(iter(training_dataset(train_set, InputSpec(128), config.data.augmentation, 8, seed=0)))
one, two = one_step(config, batch, ["/cpu:0"]), one_step(config, batch, ["/cpu:0", "/cpu:1"])
# each kind of state as one vector: a tensor whose gradient is a sum that nearly cancels
# (a batch norm's offset) differs in its own last digits by far more than the whole does
flat = {key: [np.concatenate([np.ravel(t) for t in each[key]]) for each in (one, two)] for key in one}
print(json.dumps({"apart": {key: float(np.linalg.norm(b - a) / np.linalg.norm(a)) for key, (a, b) in flat.items()},
                  "update_norm": float(np.linalg.norm(one["update"][0]))}))
"""


@pytest.fixture(scope="module")
def two_devices() -> dict:
    """Two processes side by side whose CPU is two logical devices (a worker's two GPUs), for
    the module's tests that need them (TensorFlow fixes its devices when its runtime starts):
    one steps with and without XLA; the other builds the strategies ``make_strategy`` builds on
    device lists and traces, without running, a step on an NCCL strategy with its all-reduces
    spied on. (The step on two replicas against one device has processes of its own: run after
    these strategies' collectives, its synchronized batch norms' met mismatched collective
    instance keys.)"""
    from .conftest import run_on_two_cpu_devices, side_by_side

    imports = """
import json, sys
import keras
from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import training_dataset
from detsweep.data.processing import InputSpec
from detsweep.train.checkpoint import build_training_state
from detsweep.train.step import make_train_loop
results = {}
"""
    quickstart = str(REPO / "configs" / "quickstart.yaml")
    found: dict = {}
    for part in side_by_side([lambda script=script: run_on_two_cpu_devices(
            imports + script + "print(json.dumps(results))\n", quickstart, timeout=600)
            for script in (XLA_SCRIPT, TWO_DEVICES_SCRIPT)]):
        found.update(part)
    return found


def test_two_replicas_with_different_images_step_as_one_device_on_the_same_global_batch():
    """Two logical CPU devices stand in for two GPUs (or two workers), each with 4 different
    images of the global batch of 8: a step gives one device's weights, batch statistics
    (synchronized batch norm), optimizer slots and moving averages, with clipping that bites
    and without. The loss is normalised by the global batch's positive anchors, and the
    gradient is clipped by the global norm of the summed gradient, as one device does. (One
    step: after it, float rounding in another order flips a few ReLUs, and a second step's
    gradients differ by more than rounding.)"""
    from .conftest import run_on_two_cpu_devices, side_by_side

    clips = ("10.0", "0.0")  # the quickstart's clipping bites at the first step (see the norms)
    found = dict(zip(clips, side_by_side([lambda clip=clip: run_on_two_cpu_devices(
        REPLICA_SCRIPT, str(REPO / "configs" / "quickstart.yaml"), clip, timeout=300) for clip in clips])))
    # Relative to one device's: the loss and the batch statistics within 1e-5, every kind of
    # state within 1e-3. Rounding in another order shows in the update at 2e-6 on some batches
    # and 7e-5 to 3e-4 on others (five batches measured, clipped; 1.5e-4 unclipped), where a
    # wrong normalisation or clipping per replica is off by tens of percent.
    for clip in clips:
        apart = found[clip]["apart"]
        assert max(apart["loss"], apart["statistics"]) < 1e-5 and max(apart.values()) < 1e-3, (clip, apart)
    lr = 0.04  # the quickstart's base rate, no warm-up: the first momentum step is lr x the gradient
    assert found["10.0"]["update_norm"] == pytest.approx(lr * 10.0, rel=1e-3)  # clipped to 10,
    assert found["10.0"]["update_norm"] < found["0.0"]["update_norm"]  # from more


OVERFLOW_SCRIPT = r"""
import json, os, sys
import numpy as np, tensorflow as tf
workers = "TF_CONFIG" in os.environ  # a worker of two under MultiWorkerMirroredStrategy; else two logical devices
if not workers:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from detsweep.config import load_trial_config
from detsweep.data import load_dataset
from detsweep.data.pipeline import training_dataset
from detsweep.data.processing import InputSpec
from detsweep.train.checkpoint import build_training_state
from detsweep.train.step import make_train_loop
from detsweep.train.strategy import make_strategy

config = load_trial_config(sys.argv[1], sys.argv[2:])
# detsweep's own multi-worker strategy (ring all-reduce on CPUs), made before any other op
multi_worker = make_strategy(config.scaling.model_copy(update={"num_workers": 2}), []) if workers else None
keras.mixed_precision.set_global_policy(config.train.mixed_precision)
train_set = load_dataset(config.data.train, verify=False)
batch = next(iter(training_dataset(train_set, InputSpec(config.model.image_size), config.data.augmentation, 4, seed=0)))
found = {}
for inject in (True,) if workers else (False, True):  # a process makes one multi-worker strategy
    strategy = multi_worker or tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keras.utils.set_random_seed(1)
    with strategy.scope():
        state, losses = build_training_state(config, 3)
        # from a scale at which the first replica's float16 gradients fit (Keras starts at 2**15,
        # where the quickstart's first gradients overflow on every replica)
        state.optimizer.dynamic_scale.assign(1.0)

    class Overflowing:  # the second replica's loss one a float16 gradient cannot hold; the first's as it is
        encode = losses.encode

        def terms(self, *args):
            second = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group == 1, tf.float32)
            factor = 1e30 * second + (1.0 - second) if inject else 1.0
            return {name: term * factor for name, term in losses.terms(*args).items()}

    before = [w.numpy().copy() for w in state.model.trainable_weights]
    scale = float(state.optimizer.dynamic_scale.numpy())
    # each replica its own 2 images of the global 4 (a worker: by its index)
    batches = iter(strategy.distribute_datasets_from_function(lambda context: tf.data.Dataset.from_tensors(
        tf.nest.map_structure(lambda part: part[2 * context.input_pipeline_id:][:2], batch)).repeat())
        if workers else strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch).repeat()))
    # the workers as sweeps/coco_gpu.yaml trains them: under XLA
    make_train_loop(strategy, state.model, Overflowing(), state.optimizer, None, state.step,
                    jit_compile=workers)(batches, tf.constant(1))
    copies = [strategy.experimental_local_results(w.value) for w in state.model.trainable_weights]
    found["injected" if inject else "control"] = {
        "moved": [any(not np.array_equal(c.numpy(), b) for c, b in zip(replica, before)) for replica in zip(*copies)],
        "finite": all(bool(np.isfinite(c.numpy()).all()) for each in copies for c in each),
        "scale": [scale, [float(c.numpy()) for c in strategy.experimental_local_results(state.optimizer.dynamic_scale.value)]],
    }
print(json.dumps(found))
"""


def test_mixed_float16_skips_the_step_everywhere_when_one_replica_overflows_two_logical_devices_and_two_cpu_workers_under_xla():
    """Two logical CPU devices stand in for two GPUs, and two CPU processes under
    ``MultiWorkerMirroredStrategy`` and XLA (as ``sweeps/coco_gpu.yaml`` trains) for two nodes,
    under ``mixed_float16``. The second replica's
    loss is made too large for a float16 gradient, the first's is left as it is: the loss
    scale's all-finite decision is taken on the summed gradients, so every replica skips the
    step (no weight moves, none becomes inf) and halves the scale; the two workers decide alike
    and neither waits for the other in a collective the other skipped (a hang: the workers have
    a hard time limit). Without the injection the same step is applied on both devices (the
    first replica's gradients alone are finite)."""
    import json
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from .cluster_parts import free_port
    from .conftest import cli_environment, run_bounded

    overrides = ["model.image_size=64", "optimizer.use_moving_average=false", "train.mixed_precision=mixed_float16"]
    command = [sys.executable, "-c", OVERFLOW_SCRIPT, str(REPO / "configs" / "quickstart.yaml"), *overrides]
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]

    def run(index: int | None):
        tf_config = {} if index is None else {"TF_CONFIG": json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})}
        return run_bounded(command, timeout=150, cwd=REPO, env=cli_environment(tf_config))  # 40 s here

    with ThreadPoolExecutor(3) as pool:  # the devices' process beside the two workers
        devices, *workers = pool.map(run, [None, 0, 1])
    for result in (devices, *workers):
        assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(devices.stdout.splitlines()[-1])
    control, injected = found["control"], found["injected"]
    assert control["moved"] == [True, True] and control["finite"], control
    scale = control["scale"][0]
    assert control["scale"][1] == [scale, scale], control
    assert injected["moved"] == [False, False] and injected["finite"], injected
    assert injected["scale"] == [scale, [scale / 2, scale / 2]], injected
    for worker in workers:
        alone = json.loads(worker.stdout.splitlines()[-1])["injected"]
        assert alone == {"moved": [False], "finite": True, "scale": [scale, [scale / 2]]}, alone
