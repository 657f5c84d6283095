"""The adapters a model serves, as one package (nothing is imported here; name the module):

  catalog       one adapter folder -> Adapter, checked; multi_lora.json -> AdapterCatalog; names
  checks        does an adapter fit the served base model (declared base model, weight shapes)
  sources       where adapters come from: the AdapterSource interface (scan -> candidates and
                refusals; materialise a candidate into a snapshot folder), AdapterSources
  folders       sources on disk: multi_lora.json and folder roots
  object_store  sources in object storage: s3://bucket/prefix/ roots (boto3)
  snapshots     the private, checked copies the engine reads
  registry      which version serves each name, leases, names control requests hold
  loader        one version into the engine (snapshot, check, add_lora) and out again
  pinning       adapters kept in the engine's adapter cache (serving.adapters.pinned)
  reports       rescan reports, refusals, unreadable sources, engine states (listing, metrics)
  fleet         the adapters served at runtime: rescans, load/unload, engine add/remove
  control       `adapter_command` requests (list, rescan, load, unload) run against the fleet

Imports point one way: catalog uses checks; sources uses catalog and snapshots (folders and
object_store implement it); registry and reports use sources; loader uses registry, pinning
and snapshots; fleet uses them all; control runs commands on a fleet it is handed.
"""
