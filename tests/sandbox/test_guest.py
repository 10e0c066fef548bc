"""The in-sandbox programs of sandbox/guest/, run on the host where they can be: the boot loader (modules installed
under their own names, then forgotten), the one reset check on folders of a temporary directory, the holder and the
keeper as plain subprocesses. The kernel has its own tests (test_interpreter.py); the zygote, the enter helper, PID 1
and the cleanup need a sandbox and are covered by the backend tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sandbox import programs
from sandbox.guest import boot, reset


def test_every_program_ships_its_modules_dependencies_first_and_imports_only_what_it_ships():
    for program, modules in programs.PROGRAMS.items():
        argv = programs.command(sys.executable, program, "--help")
        assert argv[: argv.index("-c")] == [sys.executable, *programs.FLAGS[program]]
        assert argv[-1] == "--help"
        if len(modules) == 1:  # no boot: the module's source itself, run through its __main__ block
            assert argv[argv.index("-c") + 1] == programs.source(modules[0])
            assert programs.source(modules[0]).endswith('    main(sys.argv[1:])\n')
        else:
            assert argv[argv.index("-c") + 2] == modules[-1]
        for name in modules:
            for line in programs.source(name).splitlines():
                if line.startswith(("from sandbox", "import sandbox")):
                    dep = line.split()[1]
                    names = [f"{dep}.{n.strip()}" for n in line.split(" import ")[1].split(",")]
                    assert dep in modules or any(n in modules for n in names), (program, name, line)


def test_boot_installs_modules_under_their_names_dependencies_first():
    before = set(sys.modules)
    code = "from sandbox.guest import two\ndef main(args):\n    return two.X, args\n"
    added = boot.install([["sandbox.guest.two", "X = 2\n"], ["sandbox.guest.one", code]])
    try:
        assert added == ["sandbox.guest.two", "sandbox.guest.one"]  # the parent packages were there already
        assert sys.modules["sandbox.guest.one"].main(["a"]) == (2, ["a"])
    finally:
        for name in added:
            sys.modules.pop(name)
            delattr(sys.modules["sandbox.guest"], name.rsplit(".", 1)[1])
    assert set(sys.modules) == before


def test_boot_runs_a_program_with_python_c_and_leaves_no_sandbox_module():
    probe = "import sys\ndef main(args):\n    print(args, sys.argv, [m for m in sys.modules if m.startswith('sandbox')])\n"
    argv = [sys.executable, "-S", "-c", programs.source(programs.BOOT), "sandbox.guest.probe", "1",
            "sandbox.guest.probe", probe, "a", "b"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == "['a', 'b'] ['-c'] []"


def _tree(tmp_path):
    dirs = []
    for name in ("tmp", "workspace", "shm"):
        d = tmp_path / name
        d.mkdir()
        dirs.append(str(d))
    return tuple(dirs)


def _changed(fresh: dict, now: dict, dirs: tuple[str, ...]) -> list[str]:
    """The folders among `dirs` whose state changed: the rest of a state (writable mounts, kernel keys) is the
    host's here, and changes whenever a Docker container starts or goes (a test beside this one, or the last one's
    pool)."""
    return [k for k in reset.changed(fresh, now) if k in dirs]


def test_reset_empties_folders_and_puts_back_their_modes(tmp_path):
    dirs = _tree(tmp_path)
    fresh = reset.state(dirs)
    (tmp_path / "tmp" / "f").write_text("x")
    locked = tmp_path / "workspace" / "a" / "b"
    locked.mkdir(parents=True)
    (locked / "g").write_text("y")
    os.chmod(locked, 0)  # an unreadable folder is opened up and removed
    os.symlink("/etc/passwd", tmp_path / "shm" / "link")  # a link is removed, never followed
    os.chmod(dirs[0], 0o700)
    assert _changed(fresh, reset.state(dirs), dirs) == [dirs[0]]
    assert any("is not empty" in p for p in reset.problems(dirs))
    assert reset.clear(dirs, fresh) == []
    assert all(os.listdir(d) == [] for d in dirs) and os.path.exists("/etc/passwd")
    assert _changed(fresh, reset.state(dirs), dirs) == []
    assert not [p for p in reset.problems(dirs) if "not empty" in p]


def test_reset_check_names_what_changed_and_main_prints_one_json_line(tmp_path, capsys):
    dirs = _tree(tmp_path)
    fresh = reset.state(dirs)
    assert not [p for p in reset.check(dirs, fresh) if "empty" in p or any(d in p for d in dirs)]
    reset.main(["--empty", *dirs])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    report = json.loads(out)
    assert isinstance(report.pop("problems"), list) and _changed(fresh, report, dirs) == []


def test_holder_says_ready_and_exits_when_stdin_closes():
    p = subprocess.Popen(programs.command(sys.executable, "holder", "marker"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    assert p.stdout.read() == b"R"  # then it closed stdout
    assert p.poll() is None
    p.stdin.close()
    assert p.wait(timeout=10) == 0


def test_keeper_forks_interpreters_and_answers_its_own_requests(tmp_path):
    p = subprocess.Popen(programs.command(sys.executable, "keeper", str(tmp_path), "300"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, start_new_session=True)

    def line() -> dict:
        while True:
            raw = p.stdout.readline()
            if raw.strip():
                return json.loads(raw)

    def ask(op: str) -> dict:
        p.stdin.write(json.dumps({"keeper": op, "nonce": op + "-n"}).encode() + b"\n")
        p.stdin.flush()
        return line()

    try:
        assert line()["keeper"] == "hello"
        assert ask("spawn") == {"keeper": "spawn-n"}
        first = line()
        assert first["ready"] is True and first["pid"] != p.pid
        p.stdin.write(json.dumps({"id": 1, "code": "import os\nos.getcwd()", "timeout_s": 5,
                                  "output_limit": 1000}).encode() + b"\n")
        p.stdin.flush()
        assert line()["stdout"] == repr(str(tmp_path)) + "\n"
        assert ask("reset") == {"keeper": "reset-n"}
        assert ask("spawn") == {"keeper": "spawn-n"} and line()["pid"] != first["pid"]
        # a checked spawn: the child empties the folder and prints the reset check's line, then the ready line
        (tmp_path / "left").write_text("x")
        assert ask("reset") == {"keeper": "reset-n"}
        p.stdin.write(json.dumps({"keeper": "spawn", "nonce": "c", "check": ["--empty", str(tmp_path)]}).encode()
                      + b"\n")
        p.stdin.flush()
        assert line() == {"keeper": "c"}
        report = line()
        assert isinstance(report["problems"], list) and not [x for x in report["problems"] if "not empty" in x]
        assert isinstance(report[str(tmp_path)], list) and list(tmp_path.iterdir()) == []
        assert line()["ready"] is True
        assert ask("nonsense")["error"] == "unknown request"
    finally:
        p.stdin.close()
        assert p.wait(timeout=10) == 0
