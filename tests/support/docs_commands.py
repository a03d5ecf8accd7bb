#!/usr/bin/env python3
"""Run the command blocks of README.md and docs/*.md that are marked runnable (the
convention: docs/runnable-docs.md; the test: tests/integration/docs_commands.sh).

    docs_commands.py ROOT BUILD WORKDIR [FILE.md ...]

A fenced block right after a line `<!-- runnable -->` (options: `<!-- runnable: timeout=120
fixture=learner -->`) is run with bash (`set -eo pipefail`) in a sandbox folder of its
document: a block whose lines start with `$ ` runs those lines only (the others are the
output shown), any other block runs whole.  A block right after `<!-- file: NAME -->` is
written to NAME in that sandbox first, for the runnable blocks after it.  The sandbox has
build/ (-> ROOT/BUILD), deploy/, docs/, tests/ and ../shared as in the repository, BUILD
in the environment, ROOT/BUILD/bin on PATH and HOME inside it.  fixture=learner starts
tests/integration/rpc_test_server (a stand-in learner with fixed answers) and points
QRL_LEARNER at it; its token is in ~/.qrl/token.  Prints one line per block and exits 1
when any block fails (its document and line, the script and the end of its output)."""
import glob, os, re, shutil, signal, subprocess, sys, time

root, build, work = sys.argv[1], sys.argv[2], sys.argv[3]
docs = sys.argv[4:] or ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=root))
MARK = re.compile(r"^<!--\s*(runnable|file)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+)\s*([^`]*)$")


def blocks(path):
    """(kind, options, first line number, lines) of each marked block of a document."""
    lines = open(os.path.join(root, path), encoding="utf-8").read().split("\n")
    i, out = 0, []
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if not m:
            f = FENCE.match(lines[i])
            if f:  # an unmarked block: skip it whole (markers quoted inside are text)
                j = i + 1
                while j < len(lines) and lines[j].strip() != f.group(2):
                    j += 1
                i = j
            i += 1
            continue
        kind, arg = m.group(1), (m.group(2) or "").strip()
        f = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not f:
            sys.exit("%s:%d: <!-- %s --> must stand right before a ``` block" % (path, i + 1, kind))
        indent, ticks, j = len(f.group(1)), f.group(2), i + 2
        while j < len(lines) and lines[j].strip() != ticks:
            j += 1
        if j == len(lines):
            sys.exit("%s:%d: the block is never closed" % (path, i + 2))
        body = [l[indent:] if l[:indent].strip() == "" else l for l in lines[i + 2:j]]
        opts = {}
        if kind == "file":
            if not arg or "/" in arg:
                sys.exit("%s:%d: <!-- file: NAME --> needs a plain file name" % (path, i + 1))
            opts["name"] = arg
        else:
            for w in arg.split():
                k, _, v = w.partition("=")
                if k not in ("timeout", "fixture") or not v:
                    sys.exit("%s:%d: unknown runnable option '%s' (timeout=S, fixture=learner)" % (path, i + 1, w))
                opts[k] = v
        out.append((kind, opts, i + 3, body))
        i = j + 1
    return out


def script(body):
    """(the commands of a block, the bash text that runs them): its `$ ` lines (with their \\
    continuations), each of which must end with status 0 as a shell prompt shows it (so
    `cmd; echo $?` may show a failing cmd), or the whole block under set -e."""
    if not any(l.startswith("$ ") for l in body):
        return "\n".join(body), "set -eo pipefail\n" + "\n".join(body)
    cmds, cont = [], False
    for l in body:
        if l.startswith("$ ") or cont:
            if cont: cmds[-1] += "\n" + l
            else: cmds.append(l[2:])
            cont = l.endswith("\\")
    checked = ["set -o pipefail"]
    for c in cmds:
        checked += [c, "rc=$?; [ $rc -eq 0 ] || { echo \"docs: exit $rc: %s\" >&2; exit $rc; }" %
                    c.split("\n")[0].replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")]
    return "\n".join(cmds), "\n".join(checked)


learner = None  # (process, address) of the stand-in learner, started on first use


def fixture_learner(home):
    global learner
    if learner:
        return learner[1]
    srv = os.path.join(root, build, "tests/integration/rpc_test_server")
    if not os.access(srv, os.X_OK):
        sys.exit("fixture=learner needs %s (make test builds it)" % srv)
    tok = os.path.join(work, "learner-token")
    open(tok, "w").write("docs-token-%d\n" % os.getpid())
    port = os.path.join(work, "learner-port")
    p = subprocess.Popen([srv, "--port-file", port, "--token-file", tok, "--lifetime", "900"],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "learner.log"), "w"))
    for _ in range(200):
        if os.path.exists(port) and open(port).read().strip():
            break
        time.sleep(0.05)
    else:
        sys.exit("the stand-in learner did not start (%s/learner.log)" % work)
    learner = (p, open(port).read().strip())
    return learner[1]


def sandbox(doc):
    d = os.path.join(work, re.sub(r"[^A-Za-z0-9_.-]", "_", doc))
    home = os.path.join(d, "home")
    os.makedirs(os.path.join(home, ".qrl"), exist_ok=True)
    links = [("build", os.path.join(root, build)), ("deploy", os.path.join(root, "deploy")),
             ("docs", os.path.join(root, "docs")), ("tests", os.path.join(root, "tests"))]
    if not os.path.isabs(build) and "/" not in build and build != "build":
        links.append((build, os.path.join(root, build)))  # BUILD=build-x, as the scripts read it
    for name, target in links:
        if not os.path.lexists(os.path.join(d, name)):
            os.symlink(target, os.path.join(d, name))
    shared = os.path.join(work, "shared")  # ../shared from the sandbox
    if not os.path.lexists(shared):
        os.symlink(os.path.realpath(os.path.join(root, "..", "shared")), shared)
    # (sandboxes are WORK/<doc>; ../shared resolves to WORK/shared)
    return d, home


failed, ran = [], 0
for doc in docs:
    bs = blocks(doc)
    if not bs:
        continue
    d, home = sandbox(doc)
    for kind, opts, line, body in bs:
        if kind == "file":
            open(os.path.join(d, opts["name"]), "w").write("\n".join(body) + "\n")
            continue
        env = dict(os.environ, HOME=home, BUILD=build,
                   PATH=os.path.join(root, build, "bin") + os.pathsep + os.environ.get("PATH", ""))
        for k in ("QRL_LEARNER", "QRL_RPC_TOKEN", "QRL_RPC_TOKEN_FILE"):
            env.pop(k, None)
        if opts.get("fixture") == "learner":
            env["QRL_LEARNER"] = fixture_learner(home)
            shutil.copy(os.path.join(work, "learner-token"), os.path.join(home, ".qrl", "token"))
        elif "fixture" in opts:
            sys.exit("%s:%d: unknown fixture '%s' (learner)" % (doc, line, opts["fixture"]))
        text, bash = script(body)
        limit = float(opts.get("timeout", 60))
        t0 = time.time()
        p = subprocess.Popen(["bash", "-c", bash], cwd=d, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            outb, _ = p.communicate(timeout=limit)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            outb, _ = p.communicate()
            rc = "timeout after %g s" % limit
        out = outb.decode("utf-8", "replace")
        ran += 1
        where = "%s:%d" % (doc, line)
        if rc == 0:
            print("ok   %s (%.1f s): %s" % (where, time.time() - t0, text.split("\n")[0][:90]))
        else:
            failed.append(where)
            print("FAIL %s: exit %s\n--- script:\n%s\n--- output (last 30 lines):\n%s" %
                  (where, rc, text, "\n".join(out.rstrip("\n").split("\n")[-30:])))
if learner:
    learner[0].terminate()
    learner[0].wait()
print("%d runnable blocks run, %d failed%s" % (ran, len(failed), (": " + ", ".join(failed)) if failed else ""))
sys.exit(1 if failed else 0)
