"""The ``openshell.v1`` message types of the wire contract.

::

    from openshell_sdk.proto import GetSandboxRequest, SERVICE_STATUS_HEALTHY

Every message and enum of ``proto/openshell/openshell.proto`` is here. The
sandbox policy and settings messages (``openshell.sandbox.v1``) are in
:data:`sandbox_pb2`, the shared data model in :data:`datamodel_pb2`.

The generated modules themselves live in ``openshell_sdk._proto`` (written by
``make generate``); this module is the stable place to import them from.
"""

from ._proto import datamodel_pb2 as datamodel_pb2
from ._proto import openshell_pb2 as openshell_pb2
from ._proto import sandbox_pb2 as sandbox_pb2
from ._proto.openshell_pb2 import *  # noqa: F403 (the whole openshell.v1 package)
