"""lancedb imported without running lance_namespace's REST client package body (memlib.io.lance_tables,
memlib.io.deferred_package): a store's tables work, and the client's names and API modules still
load when something asks for them, whichever is asked first."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

_CHILD = """
import json, sys
from pathlib import Path
import pyarrow as pa
from memlib.io.lance_tables import REST_CLIENT, connect
db = connect(Path(sys.argv[1]))
db.create_table("t", pa.table({"a": [1, 2, 3]}))
tbl = db.open_table("t")
tbl.add(pa.table({"a": [4]}))
out = {"rows": tbl.count_rows(), "sum": sum(db.open_table("t").to_arrow()["a"].to_pylist()),
       "api": REST_CLIENT + ".api" in sys.modules}
if sys.argv[2] == "api_first":
    from lance_namespace_urllib3_client.api.table_api import TableApi
import lance_namespace_urllib3_client as client
out["asked"] = client.ApiClient.__name__
from lance_namespace_urllib3_client.api.table_api import TableApi
out["same"] = client.TableApi is TableApi and client.api.TableApi is TableApi
out["api_after"] = REST_CLIENT + ".api" in sys.modules
print(json.dumps(out))
"""


@pytest.mark.parametrize("first", ["api_first", "name_first"])
def test_io_lance_import_defers_the_rest_client_and_loads_it_when_asked(tmp_path, first):
    (tmp_path / "lance").mkdir()
    res = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), first], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"rows": 4, "sum": 10, "api": False, "asked": "ApiClient", "same": True, "api_after": True}, out
