"""Transports: how ranks exchange messages. One interface (`lanes.py`: the control and bulk lanes,
what `send`, `recv` and `sent_bytes` promise), two implementations:

* `inproc.py`: threads and queues in one process (embedded runs, tests, notebooks);
* `mpi.py`: mpi4py, one progress thread per rank driving a `Sender` (`sender.py`: the lanes and
  the sends in flight) and a `Receiver` (`receiver.py`: bulk messages in assembly, paced by the
  receiver); `wire.py` is what the ranks exchange.

Importing this package does not load MPI: `MpiTransport` imports mpi4py when it is made.
"""

from dualjax.runtime.transport.inproc import InProcFabric, InProcTransport
from dualjax.runtime.transport.lanes import HostFailure, Transport
from dualjax.runtime.transport.mpi import MpiTransport, comm_world

__all__ = ["HostFailure", "InProcFabric", "InProcTransport", "MpiTransport", "Transport", "comm_world"]
