"""Exit statuses, the same on every command (`framework run`, `serve`, `bench`, ...): the command line,
the server and the benchmark all return these, so a script tells a refused plan from a bad argument
from a failed device."""

EXIT_OK = 0
EXIT_CAPABILITY = 1      # the plan cannot be carried out: a capability error at reservation
EXIT_INPUT = 2           # a bad argument, file or name
EXIT_DEVICE = 3          # a device failed while loading, compiling or running
EXIT_INTERRUPTED = 130   # Ctrl-C
EXIT_BROKEN_PIPE = 141   # the reader of standard output left (`framework run ... | head`)
EXIT_TERMINATED = 143    # SIGTERM
