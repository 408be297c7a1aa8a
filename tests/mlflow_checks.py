"""What every sweep test checks in MLflow, and a real ``mlflow server`` to check it against."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import free_port
from detsweep.tracking.checkpoint_models import best_checkpoint, checkpoints, step_of

from .conftest import REPO, commands_in_group, kill_session, time_left


def check_mlflow_runs(report: dict, num_steps: int, every: int, pbt: bool = False, registered: bool = True,
                      eval_every: int | None = None, system_metrics: bool = False) -> dict:
    """One parent run and one child run per started trial, as ``report`` (launch --json) says;
    returns the child runs by trial id. ``every``: steps per report; ``eval_every``: per
    evaluation (default: ``every``). Under ``pbt`` a trial's config and step can jump.
    ``registered``: the sweep registered its best model (else it ran with --no-register);
    ``system_metrics``: every trial that reported its first loop logged its node's."""
    from mlflow import MlflowClient

    info = report["mlflow"]
    client = MlflowClient(info["tracking_uri"])
    parent = client.get_run(info["parent_run_id"])
    tags = parent.data.tags
    assert parent.info.status == "FINISHED" and tags["detsweep.role"] == "sweep"
    assert tags["detsweep.sweep"] == report["name"] and tags["detsweep.results_path"] == report["path"]
    assert parent.data.params["search.metric"] == report["metric"]
    if report["best"]:
        best_value = report["best"]["metrics"][report["metric"]]
        assert parent.data.metrics[f"best/{report['metric']}"] == pytest.approx(best_value)
        assert tags["detsweep.best_trial"] == report["best"]["trial_id"]
    assert {"sweep.yaml", "base_config.yaml", "trials.csv", "sweep.png"} <= artifacts(client, parent.info.run_id)
    sweeps = client.search_runs([info["experiment_id"]], filter_string="tags.`detsweep.role` = 'sweep'")
    assert [run.info.run_id for run in sweeps] == [parent.info.run_id]  # a resumed sweep kept its run

    # (fine-tunes of the sweep's trials are nested under its run too: ``detsweep.role`` finetune)
    runs = client.search_runs([info["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = "
                              f"'{parent.info.run_id}' and tags.`detsweep.role` = 'trial'")
    children = {run.data.tags["detsweep.trial_id"]: run for run in runs}
    assert len(children) == len(runs) == len(report["trials"])  # one run per trial, never two
    # what each trial cost (its workers' CPUs for as long as Tune ran it) on its run, their sum on the sweep's
    assert sum(t["cost"]["cost/cpu_hours"] for t in report["trials"]) == pytest.approx(report["cost"]["cost/cpu_hours"])
    assert parent.data.metrics["cost/cpu_hours"] == pytest.approx(report["cost"]["cost/cpu_hours"])
    for trial in report["trials"]:
        run = children[trial["trial_id"]]
        assert run.info.run_id == trial["mlflow_run_id"] and run.info.run_name == f"trial_{trial['trial_id']}"
        if trial["metrics"].get("step"):  # it ran: Tune timed it
            held = run.data.metrics["cost/cpu_hours"]
            assert held == pytest.approx(trial["cost"]["cost/cpu_hours"]) and 0 < held < 1, (held, trial["cost"])
        assert run.data.metrics["cost/gpu_hours"] == 0.0  # no test sweep's trial asks for a GPU
        contexts = {i.tags[0].value for i in run.inputs.dataset_inputs}  # the runs table's Dataset column
        assert contexts == {"training", "validation"}, (trial["trial_id"], contexts)
        # MLflow's, from the node its worker ran on: its monitor starts at the first report (off the
        # start-up's path) and logs a sample at once and its last at the trial's end, stopped or not
        if system_metrics and trial["metrics"].get("step", 0) >= every:
            usage = client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
            assert usage and all(0 <= m.value <= 100 for m in usage), usage
            assert run.data.metrics["system/system_memory_usage_megabytes"] > 0
            if trial["status"] == "STOPPED":  # its last sample came after its last report, at the stop
                reported = client.get_metric_history(run.info.run_id, "train/loss")
                assert max(m.timestamp for m in usage) >= max(m.timestamp for m in reported), (usage, reported)
        assert run.data.params["train.num_steps"] == str(num_steps)
        if not pbt:
            for path, value in trial["config"].items():
                assert float(run.data.params[path]) == pytest.approx(value)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps == sorted(set(steps)), steps  # increasing, none twice
        if steps:  # every start of the trial says where its start-up time went, across its processes
            started = client.get_metric_history(run.info.run_id, "startup/total_s")
            assert started and min(m.step for m in started) == steps[0], (started, steps)
            phases = {key for key in run.data.metrics if key.startswith("startup/")}
            assert {"startup/trainer_s", "startup/workers_s", "startup/imports_s",
                    "startup/first_loop_s"} <= phases, phases
            assert "startup/mlflow_s" not in phases  # its MLflow run opens beside the start: nothing waits for it
        if not pbt:
            assert steps == list(range(every, every * len(steps) + 1, every)), steps
        if trial["status"] == "TERMINATED":
            assert steps[-1] == num_steps
            assert {"config.yaml", "learning_rate.png", "detections", "trained_with.json"} <= artifacts(client, run.info.run_id)
            # what it built, read back from the built objects, holds the values Tune drew for it
            with tempfile.TemporaryDirectory() as scratch:
                built = json.loads(Path(client.download_artifacts(run.info.run_id, "trained_with.json", scratch)).read_text())
            # (after a PBT exploit: the values of its last start, the donor's and the mutations)
            swept = {path: value for path, value in trial["config"].items() if path.startswith("optimizer.")}
            assert all(built[path] == pytest.approx(value) for path, value in swept.items()), (swept, built)
            # its checkpoints: READY models of its run, the latest at its end, and no more than its best and latest
            kept = checkpoints(client, [info["experiment_id"]], run.info.run_id, ready=False)
            assert 1 <= len(kept) <= 2 and {str(m.status) for m in kept} == {"READY"}, kept
            assert max(step_of(m) for m in kept) == num_steps
            pictures = artifacts(client, run.info.run_id, "detections")  # one per evaluation
            evaluated = [step for step in steps if step % (eval_every or every) == 0 or step == num_steps]
            assert pictures == {f"detections/step_{step:06d}.png" for step in evaluated}, pictures
        elif trial["status"] == "STOPPED" and trial["checkpoint"]:
            # stopped at a report: its own process uploaded that report's checkpoint before Tune
            # ended it (nobody else uploads one), READY, and no more than its best and latest
            kept = checkpoints(client, [info["experiment_id"]], run.info.run_id, ready=False)
            assert 1 <= len(kept) <= 2 and {str(m.status) for m in kept} == {"READY"}, kept
            assert tune_checkpoint_step(trial["checkpoint"]) in {step_of(m) for m in kept}, kept
    best = children[report["best"]["trial_id"]]
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = check_best_checkpoint(client, report, best, Path(scratch))
        if registered:  # what registration read: MLflow's best checkpoint of the best trial
            check_registered_model(client, report, best, checkpoint)
        else:
            assert report["mlflow"]["registered_model"] is None
    return children


def tune_checkpoint_step(checkpoint: str) -> int:
    """The step of a checkpoint Tune holds (a folder, or a bucket's URI)."""
    from detsweep.checkpoints import local_folder, read_step

    with local_folder(checkpoint) as directory:
        return read_step(directory)


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    return {entry.path for entry in client.list_artifacts(run_id, path)}


def check_best_checkpoint(client, report: dict, run, into: Path) -> Path:
    """The best trial's best checkpoint in MLflow is READY, complete and restores into a model
    at its step; returns where it was downloaded."""
    import shutil

    from detsweep.tracking.checkpoint_models import model_uri
    from detsweep.tracking.source import local_copy
    from detsweep.train.restore import load_trained_model

    model = best_checkpoint(client, run.info.experiment_id, run.info.run_id, report["metric"], report["mode"])
    assert model is not None and str(model.status) == "READY"
    listed = {entry.path for entry in client.list_logged_model_artifacts(model.model_id)}
    assert {"ckpt.index", "config.yaml", "meta.json"} <= listed, listed
    with local_copy(model_uri(model), report["mlflow"]["tracking_uri"]) as folder:
        directory = shutil.copytree(folder, into / "best")
    restored = load_trained_model(directory)
    assert restored.step == step_of(model)
    return Path(directory)


def check_registered_model(client, report: dict, run, checkpoint: Path) -> None:
    """The registered model was logged from the best trial's run, with the moving-average
    weights when they scored better, and detects on the trial's own val images (at their own
    size) what its ``checkpoint`` (its best in MLflow, downloaded) detects."""
    import mlflow

    from detsweep.checkpoints import read_config
    from detsweep.data import load_dataset
    from detsweep.evaluation.pictures import read_image

    from .reference_detections import assert_same_detections, detected_by_hand

    uri = report["mlflow"]["tracking_uri"]
    registered = report["mlflow"]["registered_model"]
    assert registered["name"] == report["name"]
    version = client.get_model_version(registered["name"], str(registered["version"]))
    assert version.tags["source_run_id"] == run.info.run_id
    scores = report["best"]["metrics"]
    averaged = scores.get("eval_ema/AP", -1.0) >= scores.get("eval/AP", -1.0)
    assert version.tags["moving_average"] == str(averaged).lower(), (version.tags, scores)
    # the sweep's first registration under its name: the champion; its environment pinned here
    assert str(client.get_model_version_by_alias(registered["name"], "champion").version) == str(registered["version"])
    assert registered["champion"] == registered["version"]
    assert (version.tags["metric"], float(version.tags["score"])) == (report["metric"], scores[report["metric"]])
    mlflow.set_tracking_uri(uri)
    model_uri = f"models:/{registered['name']}/{registered['version']}"
    from importlib.metadata import version as installed

    pinned = Path(mlflow.pyfunc.get_model_dependencies(model_uri)).read_text().splitlines()
    assert {f"tensorflow=={installed('tensorflow')}", f"keras-hub=={installed('keras-hub')}"} <= set(pinned), pinned
    model = mlflow.pyfunc.load_model(model_uri)
    for example in load_dataset(read_config(checkpoint).data.val).examples[:2]:
        image = read_image(example)[None]
        assert_same_detections(model.predict(image), detected_by_hand(checkpoint, image, use_average=averaged), atol=1e-4)


HEAD_SECRET = "secretsmanager:detsweep/mlflow-head"


def head_command(command: str, folder: Path, port: int, secret_name: str) -> str:
    """A command of ``ray_cluster.yaml``'s head with the head's paths under ``folder``, the
    server on ``port`` and its secret named ``secret_name`` in Secrets Manager."""
    return (command.replace("/home/ray/detsweep/cluster/tls/ca.crt", str(folder / "ca.crt"))
            .replace("/home/ray/detsweep", str(REPO)).replace("/home/ray/.detsweep/mlflow.env", str(folder / "mlflow.env"))
            .replace("/home/ray/mlflow", str(folder / "head-mlflow")).replace(" 5000", f" {port}")
            .replace(HEAD_SECRET, f"secretsmanager:{secret_name}"))


def head_commands(key: str) -> list[str]:
    import yaml

    return yaml.safe_load((REPO / "ray_cluster.yaml").read_text())[key]


@dataclasses.dataclass(frozen=True)
class HeadServer:
    uri: str
    said: str  # what its start printed
    authority: Path  # the certificate to trust
    secret_name: str  # its head secret's in Secrets Manager


@contextlib.contextmanager
def cluster_mlflow_server(folder: Path, secret: dict[str, str], aws: dict[str, str]) -> Iterator[HeadServer]:
    """The tracking server as ``ray_cluster.yaml`` makes its certificate and starts it on the
    head: its command lines, read from the file, with the head's folders moved under
    ``folder`` and a free port. detsweep's user from ``secret`` goes into the trials' file,
    the rest (if any) into the head's secret in the Secrets Manager ``aws`` reaches (moto's).
    Yields it once the command returned
    (the server answers over HTTPS and detsweep's user exists); the server is stopped at the end."""
    import boto3

    from detsweep.tracking.credentials import TRIAL_KEYS

    folder.mkdir(parents=True, exist_ok=True)
    credentials = folder / "mlflow.env"
    credentials.write_text("".join(f"{name}={value}\n" for name, value in secret.items() if name in TRIAL_KEYS))
    credentials.chmod(0o600)
    secret_name = f"detsweep-tests/{folder.name}-{os.getpid()}-{time.monotonic_ns()}"
    if head := {name: value for name, value in secret.items() if name not in TRIAL_KEYS}:
        boto3.client("secretsmanager", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-west-2",
                     aws_access_key_id="tests", aws_secret_access_key="tests").create_secret(
            Name=secret_name, SecretString="".join(f"{name}={value}\n" for name, value in head.items()))
    port = free_port()
    [make_certificate] = [c for c in head_commands("head_setup_commands") if "server tls" in c]
    [start] = [c for c in head_commands("head_start_ray_commands") if "mlflow_server.sh start" in c]
    env = {**os.environ, **aws, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    made = subprocess.run(["bash", "-c", head_command(make_certificate, folder, port, secret_name)], env=env,
                          capture_output=True, text=True, timeout=time_left(120))
    assert made.returncode == 0, made.stderr[-2000:]
    started = subprocess.Popen(["bash", "-c", head_command(start, folder, port, secret_name)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        try:
            said, _ = started.communicate(timeout=time_left(400))  # the script waits up to 300 s
        except subprocess.TimeoutExpired:
            kill_session(started)
            pytest.fail(f"the head's MLflow start did not return; it said:\n{started.communicate()[0]}")
        assert started.returncode == 0, said
        assert re.search(rf"MLflow user {secret['MLFLOW_TRACKING_USERNAME']}: (created|password set)$", said.strip()), said
        commands = commands_in_group(started.pid).values()
        assert not any("huey" in command for command in commands)  # MLflow's job runner is off
        # no secret on a command line (what `ps` shows anyone on the head) or in the server's log
        log = (folder / "head-mlflow" / "server.log").read_text(errors="replace")
        assert not [value for value in secret_values(secret) if any(value in text for text in [*commands, log, said])]
        yield HeadServer(f"https://127.0.0.1:{port}", said, folder / "ca.crt", secret_name)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.pid, signal.SIGTERM)  # the server, left running in the command's group


def secret_values(secret: dict[str, str]) -> list[str]:
    """What of a cluster's secret must show nowhere: passwords, the session key, the database's
    URI and its password."""
    from urllib.parse import urlsplit

    hidden = [secret[key] for key in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_TRACKING_PASSWORD",
                                      "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_BACKEND_STORE_URI") if key in secret]
    if "MLFLOW_BACKEND_STORE_URI" in secret:
        hidden.append(urlsplit(secret["MLFLOW_BACKEND_STORE_URI"]).password)
    return hidden


def assert_no_secret(report: dict, secret: str, tmp_path: Path) -> None:
    """``secret`` is in no param, tag or text artifact of the sweep's runs."""
    from mlflow import MlflowClient

    client = MlflowClient(report["mlflow"]["tracking_uri"])
    run_ids = [report["mlflow"]["parent_run_id"]] + [t["mlflow_run_id"] for t in report["trials"]]
    for run_id in run_ids:
        run = client.get_run(run_id)
        assert not any(secret in value for value in [*run.data.params.values(), *run.data.tags.values()])
        folder = Path(client.download_artifacts(run_id, "", str(tmp_path / "artifacts" / run_id)))
        texts = [path for path in folder.rglob("*") if path.suffix in (".yaml", ".csv", ".txt", ".json", ".journal")]
        assert texts and not any(secret in path.read_text() for path in texts)


@contextlib.contextmanager
def mlflow_server(tmp_path: Path, port: int | None = None) -> Iterator[str]:
    """A real tracking server on localhost: sqlite backend, artifacts proxied (``--serve-artifacts``).
    Started again with the same ``tmp_path`` and ``port``, it serves the same runs. Without
    ``port``, a free one; if another process takes it before the server binds it, the next one."""
    for _attempt in range(1 if port else 3):
        server, uri = _start_server(tmp_path, port or free_port(), [], dict(os.environ))
        if server is not None:
            break
    else:
        raise AssertionError(f"the MLflow server could not bind a port; its log ends:\n{_log_text(tmp_path)[-3000:]}")
    try:
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a helper of the server outlived its shutdown on a busy machine
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def _start_server(tmp_path: Path, port: int, extra: list[str], env: dict) -> tuple[subprocess.Popen | None, str]:
    """``mlflow server`` on ``port``, once it answers; (None, uri) if the port was taken (the
    process exited saying so). Only this process's answer counts: its log says it runs there."""
    import requests

    written = len(_log_text(tmp_path))
    with (tmp_path / "mlflow-server.log").open("a") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--serve-artifacts",
             "--artifacts-destination", str(tmp_path / "server-artifacts"), *extra],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
            env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # as cluster/mlflow_server.sh
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # minutes beside a busy sweep (the web app's imports)
    while time.monotonic() < deadline:
        if server.poll() is not None:
            said = _log_text(tmp_path)[written:]
            if "address already in use" in said.lower():
                return None, uri
            raise AssertionError(f"the MLflow server exited; its log ends:\n{said[-3000:]}")
        try:
            if (requests.get(f"{uri}/health", timeout=2).status_code == 200
                    and f"running on {uri}" in _log_text(tmp_path)[written:]):  # uvicorn's line, not another server's
                return server, uri
        except requests.RequestException:
            pass
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
    raise AssertionError("the MLflow server did not start in 300 s")


def _log_text(tmp_path: Path) -> str:
    path = tmp_path / "mlflow-server.log"
    return path.read_text(errors="replace") if path.exists() else ""


def check_mlflow_ui(report: dict, cwd: Path, screenshots: Path) -> None:
    """``detsweep ui`` in ``cwd`` (the embedded backend there), and Debian's Chromium, headless,
    as a user goes: the experiment's page with the sweep's run, expanded to its trials; the
    sweep's metric and cost as columns (the Columns menu); the best trial's page with its
    checkpoints; the registered model's page with its champion. Screenshots of each go to
    ``screenshots``, emptied first of an earlier run's, so that the pictures checked are this run's."""
    import os
    import signal

    from mlflow import MlflowClient
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    screenshots.mkdir(parents=True, exist_ok=True)
    for earlier in screenshots.glob("*.png"):
        earlier.unlink()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    ui = subprocess.Popen([sys.executable, "-m", "detsweep", "ui", "--port", str(port)], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=2400,1000"):
        options.add_argument(argument)
    browser = None
    try:
        wait_for_page(f"http://127.0.0.1:{port}/health")
        browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        browser.get(f"http://127.0.0.1:{port}/#/experiments/{report['mlflow']['experiment_id']}/runs")

        def rows() -> list[str]:
            """Each row's text, its pinned name cells and its value cells together (ag-grid draws them apart)."""
            joined: dict[str, str] = {}
            for part in browser.find_elements(By.CSS_SELECTOR, ".ag-row"):
                index = part.get_attribute("row-index")
                joined[index] = joined.get(index, "") + "\n" + part.text
            return [text for text in joined.values() if text.strip()]

        WebDriverWait(browser, 60).until(lambda _: any(report["name"] in row for row in rows()))
        names = [f"trial_{trial['trial_id']}" for trial in report["trials"]]
        # nested: the trials are under the sweep's run, not beside it, until it is expanded
        assert not [row for row in rows() if any(name in row for name in names)], rows()
        browser.find_element(By.CSS_SELECTOR, ".ag-row button").click()  # the sweep's run, expanded
        WebDriverWait(browser, 30).until(lambda _: all(any(name in row for row in rows()) for name in names))
        columns = [f"metrics.`{report['metric']}`", "metrics.`cost/cpu_hours`"]
        [menu] = [button for button in browser.find_elements(By.CSS_SELECTOR, "button") if button.text.strip() == "Columns"]
        menu.click()
        for column in columns:
            name = column.removeprefix("metrics.`").removesuffix("`")
            search = browser.find_element(By.CSS_SELECTOR, "input[placeholder='Search columns']")
            search.send_keys(Keys.CONTROL, "a")
            search.send_keys(name)
            found = f"//div[@data-testid='column-selector-tree']//span[normalize-space(.)='{name}']"
            WebDriverWait(browser, 10).until(lambda _, found=found: browser.find_elements(By.XPATH, found))
            browser.find_elements(By.XPATH, found)[-1].click()
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)

        def shown_columns() -> list[str]:
            return [cell.get_attribute("col-id") for cell in browser.find_elements(By.CSS_SELECTOR, ".ag-header-cell")]

        WebDriverWait(browser, 10).until(lambda _: set(columns) <= set(shown_columns()))
        # the sweep's cost, as MLflow holds it, in the sweep's row; each trial's dataset in its own
        client = MlflowClient(report["mlflow"]["tracking_uri"])
        sweep_run = client.get_run(report["mlflow"]["parent_run_id"])
        total = sweep_run.data.metrics["cost/cpu_hours"]
        WebDriverWait(browser, 10).until(lambda _: any(report["name"] in row and repr(total) in row for row in rows()))
        trial_rows = [row for row in rows() if any(name in row for name in names)]  # not a fine-tune's beside them
        assert len(trial_rows) == len(names) and all("synthetic-3c-128px-seed1" in row for row in trial_rows), rows()
        browser.save_screenshot(str(screenshots / "runs.png"))

        page = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
        # the best trial's page lists its checkpoints (its logged models), the best among them
        best = report["best"]
        checkpoint = best_checkpoint(client, report["mlflow"]["experiment_id"], best["mlflow_run_id"], report["metric"],
                                     report["mode"])
        browser.get(f"http://127.0.0.1:{port}/#/experiments/{report['mlflow']['experiment_id']}/runs/{best['mlflow_run_id']}")
        try:
            WebDriverWait(browser, 60).until(lambda _: checkpoint.name in page())
        except TimeoutException:
            browser.save_screenshot(str(screenshots / "trial-failed.png"))
            text = page()
            listed = text[text.index("Logged models"):][:1500] if "Logged models" in text else text[:1500]
            held = [(model.name, model.status) for model in checkpoints(
                client, [report["mlflow"]["experiment_id"]], best["mlflow_run_id"], ready=False)]
            raise AssertionError(f"{checkpoint.name} is not on its trial's page; MLflow holds {held}; "
                                 f"the page lists: {listed}") from None
        browser.save_screenshot(str(screenshots / "trial.png"))

        registered = report["mlflow"]["registered_model"]
        assert registered, report["mlflow"]  # the sweep registered its best checkpoint: its page shows the champion
        browser.get(f"http://127.0.0.1:{port}/#/models/{registered['name']}")
        WebDriverWait(browser, 30).until(lambda _: "@ champion" in page())
        browser.save_screenshot(str(screenshots / "model.png"))
        taken = {picture.name: picture.stat().st_size for picture in screenshots.glob("*.png")}
        assert set(taken) == {"runs.png", "trial.png", "model.png"}, taken
        assert all(size > 10_000 for size in taken.values()), taken  # a page, not a blank one
    finally:
        if browser is not None:
            browser.quit()
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def wait_for_page(url: str, timeout_s: float = 120) -> None:
    import requests

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout_s} s")
