#!/usr/bin/env python3
"""Holds COUNT idle connections to a node until killed (the bench scripts' idle load).

    scripts/hold-connections.py COUNT FIRST_PORT READY_FILE

Spread over every shard: shard i listens on FIRST_PORT + 10 i (the default stride), found by
trying to connect. From 127.0.0.2, .3, ...: 1,000 connections an address, as from many client
hosts (a shard refuses more than network.connections_per_address_max from one address).
READY_FILE is created once every connection is open. The caller raises the open-file limit.
"""
import socket
import sys
import time


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port)).close()
        return True
    except ConnectionRefusedError:
        return False


def main():
    count, first_port, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    ports = [first_port]
    while listening(ports[-1] + 10):
        ports.append(ports[-1] + 10)

    def held_connection(i):
        sock = socket.socket()
        sock.bind(("127.0.0.{}".format(2 + i // 1000), 0))
        sock.connect(("127.0.0.1", ports[i % len(ports)]))
        return sock

    held = [held_connection(i) for i in range(count)]
    open(ready, "w").close()
    while held:
        time.sleep(3600)


if __name__ == "__main__":
    main()
