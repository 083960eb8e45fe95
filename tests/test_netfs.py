"""An inbox on a network or FUSE filesystem: inotify sees no write made behind the
mount, so the service polls there by itself, says why, and `--no-polling` overrides it.

The detection is tested on real mountinfo lines (NFS, SMB/CIFS, 9p, sshfs, containers);
the service itself on a real FUSE mount (bindfs, Debian's package) whose backing folder is
written to as another host would write to a share: the kernel raises no inotify event on
the mount for those writes. Without /dev/fuse (a container started without it) that test is
skipped with the reason; without bindfs too, except under CI=true, where that is a failure
(`.ci/run` installs bindfs).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PATIENCE, tasks, wait_for

from dropbox_eval.inbox.mounts import Mount, choose_polling, mount_of, parse_mountinfo, remote_mount

# this machine's mountinfo, as read when the test was written (a local root filesystem)
LOCAL = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12358000k,nr_inodes=3089500,mode=755
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24731184k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# an NFS export and an SMB share (with a space in its mount point) on a Debian host
SHARES = """\
29 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw,errors=remount-ro
544 29 0:52 / /srv/eval rw,relatime shared:290 - nfs4 files.example.com:/export/eval \
rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,\
sec=sys,clientaddr=10.0.0.5,local_lock=none,addr=10.0.0.2
612 29 0:60 / /mnt/drop\\040box rw,relatime shared:310 - cifs //nas/drop rw,vers=3.1.1,\
cache=strict,username=eval,uid=1000,noforceuid,gid=1000,noforcegid,addr=192.168.1.10,soft
640 544 0:61 / /srv/eval/local rw,relatime shared:320 - tmpfs tmpfs rw,size=102400k
"""
# WSL 2: the Windows drive is a 9p mount
WSL = """\
63 68 8:32 / / rw,relatime - ext4 /dev/sdc rw,discard,errors=remount-ro,data=ordered
90 63 0:46 / /mnt/c rw,noatime - 9p C:\\134 rw,dirsync,aname=drvfs;path=C:\\;uid=1000;\
gid=1000;symlinkroot=/mnt/,mmap,access=client,msize=65536,trans=fd,rfd=5,wfd=5
"""
# a container: overlay root, a bind-mounted host folder, then sshfs mounted over it
CONTAINER = """\
1200 1100 0:300 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/l/A,\
upperdir=/var/lib/docker/B/diff,workdir=/var/lib/docker/B/work
1201 1200 254:1 /srv/eval /data rw,relatime - ext4 /dev/vda1 rw
1202 1201 0:70 / /data/inbox rw,nosuid,nodev,relatime - fuse.sshfs op@host:/srv/inbox \
rw,user_id=1000,group_id=1000
"""


def test_the_mount_holding_the_inbox_decides() -> None:
    assert remote_mount("/home/op/eval/inbox", LOCAL) is None
    nfs = remote_mount("/srv/eval/inbox", SHARES)
    assert nfs == Mount("/srv/eval", "nfs4", "files.example.com:/export/eval")
    assert nfs.kind == "NFS"
    smb = remote_mount("/mnt/drop box/inbox", SHARES)
    assert smb is not None and smb.kind == "SMB/CIFS" and smb.point == "/mnt/drop box"
    assert remote_mount("/srv/eval/local/inbox", SHARES) is None  # longest prefix: tmpfs
    assert remote_mount("/srv/evaluation", SHARES) is None  # a prefix of the name, not a parent
    wsl = remote_mount("/mnt/c/Users/op/inbox", WSL)
    assert wsl is not None and wsl.kind == "9p" and wsl.source == "C:\\"
    assert remote_mount("/home/op/inbox", WSL) is None
    sshfs = remote_mount("/data/inbox", CONTAINER)
    assert sshfs is not None and sshfs.kind == "FUSE" and sshfs.fstype == "fuse.sshfs"
    assert remote_mount("/data/outbox", CONTAINER) is None  # the bind mount: ext4


def test_a_mount_over_another_at_the_same_point_wins() -> None:
    stacked = LOCAL + "50 27 0:40 / /srv rw - nfs h:/a rw\n51 27 0:41 / /srv rw - ext4 /dev/b rw\n"
    found = mount_of("/srv/inbox", parse_mountinfo(stacked))
    assert found is not None and found.fstype == "ext4"
    assert remote_mount("/srv/inbox", stacked) is None


def test_malformed_lines_are_skipped() -> None:
    assert parse_mountinfo("garbage\n1 2 3\n\n" + LOCAL)[0].point == "/proc"
    assert len(parse_mountinfo(LOCAL)) == 6


def test_polling_is_chosen_and_explained(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(SHARES, encoding="utf-8")
    share = Path("/srv/eval/inbox")
    polls, why = choose_polling(None, share, mountinfo)
    assert (
        polls
        and why is not None
        and why.startswith(
            "inbox /srv/eval/inbox is on NFS (nfs4 files.example.com:/export/eval mounted at "
            "/srv/eval): polling it"
        )
    )
    polls, why = choose_polling(False, share, mountinfo)
    assert not polls and why is not None and "but polling is off" in why
    assert choose_polling(True, share, mountinfo) == (True, None)
    assert choose_polling(None, Path("/var/inbox"), mountinfo) == (False, None)  # local
    assert choose_polling(True, Path("/var/inbox"), mountinfo) == (True, None)
    assert choose_polling(None, share, tmp_path / "absent") == (False, None)  # not Linux
    link = tmp_path / "link"  # symlinks are resolved before the lookup
    link.symlink_to(share)
    assert choose_polling(None, link / "x", mountinfo)[0]


@pytest.fixture
def fuse_home(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(home, behind): a service home whose inbox `_mount` makes a real FUSE mount
    (bindfs) of `behind`; a file written to `behind` appears in the inbox with no inotify
    event. Unmounted at the end."""
    if not os.path.exists("/dev/fuse"):  # a container started without the device
        pytest.skip("no /dev/fuse here: the mountinfo samples above test the detection")
    bindfs = shutil.which("bindfs")
    if bindfs is None:
        missing = "a real FUSE mount needs bindfs (Debian: apt-get install bindfs)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must test an inbox on FUSE: {missing}")
        pytest.skip(missing)
    home, behind = tmp_path / "home", tmp_path / "share"
    (home / "inbox").mkdir(parents=True)
    (behind / "acme").mkdir(parents=True)
    try:
        yield home, behind
    finally:
        subprocess.run(["fusermount", "-u", str(home / "inbox")], check=False, timeout=60)


def _mount(behind: Path, inbox: Path) -> None:
    bindfs = shutil.which("bindfs")
    assert bindfs is not None
    mounted = subprocess.run([bindfs, str(behind), str(inbox)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"bindfs could not mount: {mounted.stderr}"


def _service(home: Path, how: str = "") -> subprocess.Popen[str]:
    """`run --sandbox` on `home`, with `how`: a flag, or a VARIABLE=value."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAAS_EVAL_")}
    env.update(SAAS_EVAL_QUIET_PERIOD="0.2", SAAS_EVAL_RESCAN_INTERVAL="3600")
    command = [sys.executable, "-m", "dropbox_eval", "--home", str(home), "run", "--sandbox"]
    name, _, value = how.partition("=")
    if value:
        env[name] = value
    elif how:
        command.append(how)
    return subprocess.Popen(
        command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )


def _drop_behind(folder: Path, name: str) -> Path:
    """Write a batch beside the mount, as another host writes to a share."""
    upload = folder / f"{name}.part"
    upload.write_text(json.dumps({"tasks": tasks(1)}), encoding="utf-8")
    return upload.rename(folder / name)


def _stop(service: subprocess.Popen[str]) -> str:
    service.send_signal(signal.SIGTERM)
    _, stderr = service.communicate(timeout=PATIENCE)
    return stderr


def test_an_inbox_on_fuse_is_polled_by_itself(fuse_home: tuple[Path, Path]) -> None:
    home, behind = fuse_home
    _mount(behind, home / "inbox")
    first = _drop_behind(behind / "acme", "first.json")  # found by the scan at start
    service = _service(home)
    try:
        assert wait_for(lambda: not first.exists()), "the start-up scan never took it"
        second = _drop_behind(behind / "acme", "second.json")  # after the only scan
        assert wait_for(lambda: not second.exists()), "polling never found it"
    finally:
        stderr = _stop(service)
    assert service.returncode == 0, stderr
    assert f"inbox {home.resolve() / 'inbox'} is on FUSE (fuse {behind}" in stderr
    assert "polling it, since inotify sees no writes made by other hosts" in stderr
    assert (behind / "acme" / "rejected" / "second.json").exists()  # unknown client


@pytest.mark.parametrize("how", ["--no-polling", "SAAS_EVAL_POLLING=false"])
def test_no_polling_overrides_it_and_says_what_is_missed(
    fuse_home: tuple[Path, Path], how: str
) -> None:
    home, behind = fuse_home
    _mount(behind, home / "inbox")
    first = _drop_behind(behind / "acme", "first.json")
    service = _service(home, how)
    try:
        assert wait_for(lambda: not first.exists()), "the start-up scan never took it"
        missed = _drop_behind(behind / "acme", "missed.json")
        seen = _drop_behind(home / "inbox" / "acme", "seen.json")  # through the mount
        assert wait_for(lambda: not seen.exists()), "inotify never reported it"
        assert not wait_for(lambda: not missed.exists(), 3.0)  # no event, no rescan yet
    finally:
        stderr = _stop(service)
    assert service.returncode == 0, stderr
    assert "but polling is off (--no-polling or SAAS_EVAL_POLLING=false)" in stderr
    assert "polling it" not in stderr


def test_a_share_mounted_over_the_inbox_while_running_is_polled(
    fuse_home: tuple[Path, Path],
) -> None:
    """The watcher rebuilds its observer when the inbox folder is replaced; it decides
    again then, so a share mounted after the start is polled too."""
    home, behind = fuse_home
    service = _service(home)
    lines: list[str] = []
    assert service.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(service.stderr or []), daemon=True)
    reader.start()
    try:
        assert wait_for(lambda: any("service started" in line for line in lines))
        assert not any("polling it" in line for line in lines)  # a local folder: inotify
        _mount(behind, home / "inbox")
        assert wait_for(lambda: any("is on FUSE" in line for line in lines)), lines
        dropped = _drop_behind(behind / "acme", "late.json")
        assert wait_for(lambda: not dropped.exists()), "polling never found it"
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=PATIENCE)
        reader.join(timeout=PATIENCE)
    assert service.returncode == 0, lines
    assert any("stopped delivering events" in line for line in lines)  # the rebuild
    assert any("polling it, since inotify sees no writes" in line for line in lines)
