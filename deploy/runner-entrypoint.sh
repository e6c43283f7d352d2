#!/bin/sh
# The runner container's entrypoint: make the container's own cgroup tree
# usable by the jail, then exec `asbx runner`.
#
# The jail (crates/asbx-jail/src/cgroup.rs) creates one cgroup per sandbox
# under /sys/fs/cgroup/asbx/ and writes its memory, pids and cpu limits.
# A container runtime mounts /sys/fs/cgroup read-only, so:
#
# cgroup v2 (needs the private cgroup namespace containerd and CRI-O give a
#   container on a cgroup v2 node: /sys/fs/cgroup is then the pod
#   container's own cgroup, never the node's):
#   1. remount it read-write (CAP_SYS_ADMIN; the change is visible in this
#      container's mount namespace only);
#   2. move every process of the container into the leaf `runner`: cgroup v2
#      lets a cgroup delegate controllers to children only when it holds no
#      process itself ("no internal processes"), and the jail enables
#      memory, pids and cpu for `asbx/`.
#   Sandboxes therefore stay inside the pod's cgroup: the pod's memory and
#   CPU limits bound all of its sandboxes together, and the kubelet sees them.
# cgroup v1: each controller is a read-only bind of the container's cgroup;
#   remount memory, pids, cpu and (when there) freezer read-write.
#
# Only the `strict` profile uses cgroups; `namespaces` skips all of this.
set -eu

CG=/sys/fs/cgroup
log() { echo "asbx-runner-entrypoint: $*" >&2; }
writable() {
    probe="$1/.asbx-probe-$$"
    mkdir "$probe" 2>/dev/null && rmdir "$probe"
}

if [ "${ASBX_PROFILE:-strict}" = strict ]; then
    if [ "$(stat -f -c %T "$CG")" = cgroup2fs ]; then
        if [ "$(cat /proc/self/cgroup)" != "0::/" ]; then
            log "cgroup v2 without a private cgroup namespace ($(cat /proc/self/cgroup));"
            log "refusing to touch what may be the node's cgroup tree"
            exit 1
        fi
        if ! writable "$CG"; then
            mount -o remount,rw "$CG" 2>/dev/null \
                || { umount "$CG" && mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$CG"; } \
                || { log "cannot make $CG writable (needs CAP_SYS_ADMIN, AppArmor unconfined)"; exit 1; }
        fi
        mkdir -p "$CG/runner"
        for pid in $(cat "$CG/cgroup.procs"); do
            echo "$pid" >"$CG/runner/cgroup.procs" 2>/dev/null || true
        done
        log "cgroup v2: $CG writable, controllers: $(cat "$CG/cgroup.controllers")"
    else
        for c in memory pids cpu freezer; do
            # freezer is optional (the jail uses it for tool cgroups when present).
            if [ ! -e "$CG/$c" ]; then
                [ "$c" = freezer ] && continue
                log "cgroup v1 without the $c controller"; exit 1
            fi
            mp=$(readlink -f "$CG/$c")
            if ! writable "$mp"; then
                mount -o remount,bind,rw "$mp" 2>/dev/null \
                    || mount -o remount,rw "$mp" \
                    || { log "cannot make $mp writable"; exit 1; }
            fi
        done
        log "cgroup v1: memory, pids, cpu (and freezer, if present) writable"
    fi
fi

exec /usr/local/bin/asbx runner "$@"
