"""A fake DNS server on 127.0.0.1 (UDP, a free port) for the router's --worker-dns tests: it
answers A queries for the names a test sets (TTL 0), NODATA for other record types of those
names, and NXDOMAIN for every other name. Built on dnslib (pinned in requirements.txt)."""

import threading

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from rltest import free_port


class FakeDns(BaseResolver):
    def __init__(self):
        self._lock = threading.Lock()
        self._names = {}  # "name." -> [ipv4, ...]
        self.queries = 0
        self.port = free_port()
        self._server = DNSServer(self, port=self.port, address="127.0.0.1",
                                 logger=DNSLogger(log="-request,-reply,-truncated,-data"))
        self._server.start_thread()
        self.address = f"127.0.0.1:{self.port}"

    def set(self, name, ips):
        """`name` resolves to `ips` from now on (an empty list: the name exists, no address)."""
        with self._lock:
            self._names[name.rstrip(".") + "."] = list(ips)

    def resolve(self, request, handler):
        reply = request.reply()
        qname = str(request.q.qname)
        with self._lock:
            self.queries += 1
            ips = self._names.get(qname)
        if ips is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.A:
            for ip in ips:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=0))
        return reply

    def stop(self):
        """Stops answering (idempotent): lookups then time out."""
        if self._server is not None:
            self._server.stop()
            self._server.server.server_close()
            self._server = None
