"""What every fault is, the absence of one, and several at once."""
from .. import needs


class Fault:
    needs = ()
    summary = "no fault"

    def missing(self):
        for need in self.needs:
            reason = needs.check(need)
            if reason:
                return reason
        return None

    def prepare(self, run):
        pass

    def setup_lines(self):
        """Shell lines run as root in the target rank's mount namespace before it starts."""
        return []

    def enter(self):
        """A command prefix that enters an existing mount namespace for the target, or None."""
        return None

    def own_mounts(self):
        return ()

    def agent_args(self):
        """Flags the node's agent needs to see what this fault makes (an interface to read)."""
        return []

    def served(self, run):
        """What a store this fault runs served against what the agent counted, or None."""
        return None

    def tick(self, run, elapsed):
        pass


class NoFault(Fault):
    pass


class Combined(Fault):
    """Several faults on the target rank at once, prepared in the order given (a later
    one may build on an earlier one's plan changes: a cache in front of a FUSE mount)."""

    def __init__(self, *parts):
        self.parts = parts
        self.summary = "; ".join(p.summary for p in parts) if parts else Fault.summary

    def missing(self):
        return next((r for r in (p.missing() for p in self.parts) if r), None)

    def prepare(self, run):
        for p in self.parts:
            p.prepare(run)

    def setup_lines(self):
        return [line for p in self.parts for line in p.setup_lines()]

    def enter(self):
        return next((e for e in (p.enter() for p in self.parts) if e), None)

    def own_mounts(self):
        return tuple(m for p in self.parts for m in p.own_mounts())

    def agent_args(self):
        return [a for p in self.parts for a in p.agent_args()]

    def served(self, run):
        return next((s for s in (p.served(run) for p in self.parts) if s), None)

    def tick(self, run, elapsed):
        for p in self.parts:
            p.tick(run, elapsed)


def available(*parts):
    """(the faults this machine can inject, {fault: why not} for the others): for a setup
    that injects what it can and says what it left out."""
    ready = [p for p in parts if not p.missing()]
    return ready, {p: p.missing() for p in parts if p.missing()}
