"""Running the roles together on one box: the launcher (`edgeinspect up`), its roles table and credentials, the gate
demo and `edgeinspect verify`. The roles themselves live in edgeinspect.services; this package only starts them."""
