"""Two threads of one process may write the same file at once (the digests'
cache): each writer thread has a temporary name of its own, so both writes land whole."""

import json
import threading

from mule.storage.atomic import temporary_name, write_json_atomic


def test_two_threads_writing_one_file_each_use_their_own_temporary(tmp_path):
    path = tmp_path / "file_hashes.json"
    names, errors, start = {}, [], threading.Barrier(2)

    def writer(n: int) -> None:
        names[n] = temporary_name(path)
        start.wait()
        try:
            for i in range(200):
                write_json_atomic({"writer": n, "i": i}, path)
        except Exception as error:  # noqa: BLE001 - what the test reports
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert names[0] != names[1]
    assert not errors, errors[:1]
    assert json.loads(path.read_text())["i"] == 199
