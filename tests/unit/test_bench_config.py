"""BenchConfig validation and the CLI's parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dataflow.bench.__main__ import build_parser, config_from_args, main
from dataflow.bench.config import BenchConfig
from dataflow.bench.session import free_tag
from dataflow.bench.sweep import axis_label, point_config, run_sweep, value_label
from dataflow.errors import ConfigError
from dataflow.readers import open_shard

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_valid():
    cfg = BenchConfig(data=("d",))
    assert cfg.workers_per_server == cfg.workers // cfg.servers


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": ()}, "`data` must be"),
        ({"loaders": ()}, "`loaders` must name"),
        ({"loaders": ("dataflow", "nope")}, "Found: 'nope'"),
        ({"loaders": ("torch", "torch")}, "must not repeat"),
        ({"batch_size": 0}, "`batch_size` must be an integer >= 1. Found: 0"),
        ({"repeats": -1}, "`repeats` must be an integer >= 1"),
        ({"warmup": 0}, "`warmup` must be an integer >= 1"),
        ({"step": "tpu"}, "`step` must be one of"),
        ({"step_ms": -1.0}, "`step_ms` must be 0 or more"),
        ({"workers": 3, "servers": 2}, "multiple of `servers`"),
        ({"out_dir": ""}, "`out_dir`"),
        ({"io_threads": 0}, "`io_threads` must be an integer >= 1. Found: 0"),
    ],
)
def test_invalid_configs_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        BenchConfig(**{"data": ("d",), **kwargs})


def test_endpoints_lift_the_server_split_rule():
    cfg = BenchConfig(data=("d",), workers=3, servers=2, endpoints=("tcp://127.0.0.1:5555",))
    assert cfg.endpoints


def test_sweep_points():
    base = BenchConfig(data=("d",), workers=2, servers=2)
    assert point_config(base, "step-ms", 5).step_ms == 5.0
    four = point_config(base, "servers", 4)
    assert (four.servers, four.workers) == (4, 4)
    with pytest.raises(ConfigError, match="`axis`"):
        point_config(base, "batch", 1)
    with pytest.raises(ConfigError, match="whole numbers of 1 or more. Found: 1.5"):
        point_config(base, "servers", 1.5)


def test_a_step_of_0_ms_is_labelled_as_no_step():
    base = BenchConfig(data=("d",))
    assert [value_label("step-ms", v) for v in (0, 2.5, 10)] == ["no step", "2.5", "10"]
    assert value_label("servers", 1) == "1"
    assert "0: no step" in axis_label(base, "step-ms")


def test_servers_split_keeps_the_total_readers():
    base = BenchConfig(data=("d",), workers=12, servers=1)
    points = [point_config(base, "servers-split", n) for n in (1, 2, 4)]
    assert [(p.servers, p.workers_per_server, p.workers) for p in points] == [
        (1, 12, 12), (2, 6, 12), (4, 3, 12)]
    with pytest.raises(ConfigError, match=r"splits `workers` \(12\) evenly over the servers; "
                       r"5 server\(s\) do not divide it. Found: servers=5, workers=12"):
        point_config(base, "servers-split", 5)
    with pytest.raises(ConfigError, match="`servers-split` sweep values must be whole"):
        point_config(base, "servers-split", 0)
    given = BenchConfig(data=("d",), endpoints=("tcp://127.0.0.1:5555",))
    for axis in ("servers", "servers-split"):
        with pytest.raises(ConfigError, match=f"a `{axis}` sweep starts local servers"):
            point_config(given, axis, 2)


def test_a_sweep_refuses_a_bad_point_before_running_any(tmp_path):
    base = BenchConfig(data=(str(tmp_path / "none"),), workers=6, servers=1,
                       out_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="4 server"):
        run_sweep(base, "servers-split", [1, 2, 4])
    assert not (tmp_path / "out").exists()


def test_servers_split_cli_ignores_servers(tmp_path):
    args = build_parser().parse_args(
        ["sweep", str(tmp_path), "--axis", "servers-split", "--workers", "3",
         "--values", "1,3"])
    cfg = config_from_args(args)
    assert (cfg.workers, cfg.servers) == (3, 1)


def test_the_demo_repeats_interleaved_runs(tmp_path):
    def parsed(*extra):
        return config_from_args(build_parser().parse_args(["demo", str(tmp_path), *extra]))

    cfg = parsed()
    assert (cfg.warmup, cfg.steps, cfg.repeats) == (5, 100, 3)
    assert parsed("--repeats", "5").repeats == 5
    assert parsed("--quick").repeats == 1


def test_a_second_run_never_overwrites_the_first(tmp_path):
    def files(tag):
        return [f"{tag}.json", f"{tag}-servers-2.json"]

    assert free_tag(str(tmp_path), "sweep", files) == "sweep"
    (tmp_path / "sweep-servers-2.json").write_text("{}")
    assert free_tag(str(tmp_path), "sweep", files) == "sweep-2"
    (tmp_path / "sweep-2.json").write_text("{}")
    assert free_tag(str(tmp_path), "sweep", files) == "sweep-3"


def test_cli_parses_into_config(tmp_path):
    args = build_parser().parse_args(
        ["run", str(tmp_path), "--loaders", "torch,dataflow", "--step", "cpu", "--step-ms", "3",
         "--quick", "--io-threads", "3", "--out", str(tmp_path / "o")])
    cfg = config_from_args(args)
    assert cfg.loaders == ("torch", "dataflow")
    assert (cfg.step, cfg.step_ms, cfg.repeats, cfg.steps) == ("cpu", 3.0, 1, 100)
    assert cfg.io_threads == 3


def test_image_shape_makes_its_own_demo_dataset(tmp_path):
    args = build_parser().parse_args(
        ["run", "--format", "arrow", "--shards", "2", "--samples-per-shard", "3",
         "--image-shape", "3,8,4", "--out", str(tmp_path)])
    cfg = config_from_args(args)
    assert cfg.data == (str(tmp_path / "demo-arrow-2x3-3x8x4"),)
    reader = open_shard(sorted(Path(cfg.data[0]).glob("*.arrow"))[0].as_posix())
    assert reader.read(0, 2)["image"].shape == (2, 3, 8, 4)


def test_cli_rejects_unknown_loader(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "x", "--loaders", "dataflow,nope"])
    assert e.value.code == 2
    assert "unknown loader 'nope'" in capsys.readouterr().err


def test_cli_bad_data_is_a_clear_error(tmp_path, capsys):
    code = main(["run", str(tmp_path / "missing-*.tar"), "--out", str(tmp_path)])
    assert code == 2
    assert "missing-*.tar" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_help_works_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "dataflow.bench", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: python -m dataflow.bench" in done.stdout
    assert "GPU-idle" in done.stdout


@pytest.mark.parametrize("sub", ["demo", "run", "sweep"])
def test_subcommand_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([sub, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--loaders" in out and "--step" in out
