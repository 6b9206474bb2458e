"""`gc3 catalog build` (runtime_cuda/commands/catalog.py over runtime_cuda/nccl/samples.py) as a
user meets it: its help, a bad option refused with exit 2, a build into a folder of one's own that
is byte for byte the shipped ir_samples/, and --check saying what differs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "ir_samples"


def gc3(*args, cwd=ROOT):
    out = subprocess.run([sys.executable, "-m", "runtime_cuda", "catalog", "build", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    return out.returncode, out.stdout, out.stderr


def test_help_names_the_options():
    rc, out, _ = gc3("--help")
    assert rc == 0 and "Usage: gc3 catalog build" in out and "--out" in out and "--check" in out, out


def test_the_catalog_group_lists_build_beside_check():
    out = subprocess.run([sys.executable, "-m", "runtime_cuda", "catalog", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "build" in out.stdout and "check" in out.stdout, out.stdout


def test_a_bad_option_exits_2_naming_it():
    rc, out, err = gc3("--bogus")
    assert rc == 2 and "No such option '--bogus'" in err and "Traceback" not in out + err, err


def test_an_out_folder_that_cannot_be_made_exits_2_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    rc, out, err = gc3("--out", str(tmp_path / "file" / "samples"))
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "FAILED" in err and "cannot write the samples there" in err, err


def test_a_build_is_the_shipped_catalog_and_check_says_what_differs(tmp_path):
    out_dir = tmp_path / "samples"
    out_dir.mkdir()
    (out_dir / "stale.xml").write_text("<algo/>")
    rc, out, err = gc3("-q", "--out", str(out_dir), cwd=tmp_path)
    assert rc == 0 and out.startswith("wrote ") and f"and index.json to {out_dir}" in out, out + err
    assert not (out_dir / "stale.xml").exists()
    shipped = sorted(p.name for p in SAMPLES.iterdir() if p.is_file())
    assert sorted(p.name for p in out_dir.iterdir()) == shipped
    assert all((out_dir / name).read_bytes() == (SAMPLES / name).read_bytes() for name in shipped)

    rc, out, err = gc3("-q", "--check", "--out", str(out_dir))
    assert rc == 0 and "OK: up to date" in out, out + err

    index = out_dir / "index.json"
    index.write_text(index.read_text().replace('"version": 1', '"version": 2'))
    (out_dir / shipped[0]).unlink()
    rc, out, err = gc3("-q", "--check", "--out", str(out_dir))
    assert rc == 1, out + err
    assert out.splitlines() == [f"{shipped[0]}: missing from {out_dir}",
                                "index.json: differs from what `gc3 catalog build` writes now"]
    assert f"run: gc3 catalog build --out {out_dir}" in err and index.read_text().count('"version": 2') == 1
